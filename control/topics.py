"""Part: control. The MQTT topics of the control plane (contract: proto/gpuprobe/v1/control.proto, docs/wire.md).

=============================================  ===============  ===  ========  ===================
topic                                          payload          QoS  retained  publisher
=============================================  ===============  ===  ========  ===================
``gpuprobe/v1/presence/{host}``                AgentPresence    1    yes       agent (+ last will)
``gpuprobe/v1/commands``                       SignedCommand    1    no        operator
``gpuprobe/v1/replies/{command_id}/{host}``    CommandReply     1    no        agent
``gpuprobe/v1/progress/{probe_id}/{host}``     ProbeProgress    0    yes       agent
``gpuprobe/v1/results/{probe_id}/{host}``      ProbeResult      1    yes       agent
=============================================  ===============  ===  ========  ===================
"""

from __future__ import annotations

import re

from gpuprobe.errors import ConfigError

PREFIX = "gpuprobe/v1"
COMMANDS = f"{PREFIX}/commands"
PRESENCE_ALL = f"{PREFIX}/presence/+"

# Probe ids the CLI accepts: short, readable, safe as a topic segment and a tag value.
_PROBE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
_FORBIDDEN = set("/+#\x00")


class TopicError(ConfigError):
    """A host name or id that cannot be a topic segment."""


def check_segment(value: str, what: str) -> str:
    """``value`` unchanged if it can be one topic segment: not empty, no ``/``, ``+``, ``#``, NUL or
    control characters, at most 256 characters."""
    if not value:
        raise TopicError(f"{what} must not be empty")
    if len(value) > 256:
        raise TopicError(f"{what} {value[:32]!r}... is longer than 256 characters")
    if _FORBIDDEN & set(value) or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise TopicError(f"{what} {value!r} must not contain '/', '+', '#', NUL or control characters")
    return value


def check_probe_id(value: str) -> str:
    if not _PROBE_ID.match(value):
        raise TopicError(
            f"probe id {value!r}: 1-64 characters (letters, digits, '.', '_', ':', '-'), "
            "starting with a letter or digit"
        )
    return value


def presence(host: str) -> str:
    return f"{PREFIX}/presence/{host}"


def replies(command_id: str, host: str = "+") -> str:
    return f"{PREFIX}/replies/{command_id}/{host}"


def progress(probe_id: str, host: str = "+") -> str:
    return f"{PREFIX}/progress/{probe_id}/{host}"


def results(probe_id: str, host: str = "+") -> str:
    return f"{PREFIX}/results/{probe_id}/{host}"


def split(topic: str) -> list[str]:
    """The segments after ``gpuprobe/v1/``: ``["results", "p-1", "gpu-a"]``."""
    if not topic.startswith(PREFIX + "/"):
        return []
    return topic[len(PREFIX) + 1 :].split("/")
