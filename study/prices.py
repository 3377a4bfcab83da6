"""Part: study. The prices file of ``gpuprobe study report --prices FILE``: what one node of each instance type costs.

A TOML file of one table, instance type = price per hour of the whole node in USD::

    # on-demand, us-east-1, 2025-06
    "p5.48xlarge" = 98.32
    "g6.12xlarge" = 4.6016
    "lab-dgx-a100" = 0         # own hardware: counted at no cost

Keys with dots must be quoted (TOML would read ``p5.48xlarge = …`` as a table ``p5``). Anything else
— a table, a string, a boolean, an array, a date, a negative or non-finite number — is an error that
names the file and the key (:class:`gpuprobe.errors.ConfigError`).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from gpuprobe.errors import ConfigError

FORMAT = 'one line per instance type: "INSTANCE TYPE" = PRICE PER HOUR IN USD, e.g. "p5.48xlarge" = 98.32'


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    return f"{type(value).__name__} {value!r}"


def parse_prices(data: dict[str, Any], source: str = "prices") -> dict[str, float]:
    """The prices of a parsed TOML document; :class:`ConfigError` for anything that is not one."""
    prices: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            inner = ", ".join(repr(k) for k in list(value)[:3])
            hint = f' (a dotted key: quote it, "{key}.{next(iter(value))}" = …)' if value else ""
            raise ConfigError(
                f"{source}: {key!r} is a table with keys {inner or 'none'}{hint}; the file holds {FORMAT}"
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(
                f"{source}: the price of {key!r} is {_describe(value)}, not a number of USD per hour; the file holds "
                f"{FORMAT}"
            )
        price = float(value)
        if not math.isfinite(price) or price < 0:
            raise ConfigError(f"{source}: the price of {key!r} must be a finite number ≥ 0 (USD per hour), not {value}")
        if not key.strip():
            raise ConfigError(f"{source}: an empty instance type; the file holds {FORMAT}")
        prices[key] = price
    return prices


def load_prices(path: Path) -> dict[str, float]:
    """Instance type -> USD per hour, from a prices file; :class:`ConfigError` naming the file and the
    problem when it cannot be read or holds anything else."""
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"prices file {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"prices file {path} cannot be read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"prices file {path} is not valid TOML: {e}; it holds {FORMAT}") from None
    return parse_prices(data, f"prices file {path}")
