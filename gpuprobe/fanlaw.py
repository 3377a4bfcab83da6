"""Part: core (ground floor). The fan law: how a fan's A-weighted level follows its speed.

``L2 = L1 + FAN_LAW_DB_PER_DECADE·log10(n2/n1)``: sound power grows with the fifth power of fan speed
(cpemma fan laws; Levitronix: +10 % speed ≈ +2 dB), 50 dB per decade of speed. The agent's acoustic
proxy (``agent/sensors/proxy.py``) uses it; a microphone calibration (``model/acoustic.py``) reports the
exponent its slope implies; ``tests/test_fan_law.py`` holds it against manufacturers' published levels
of fans at several speeds (``tests/data/fans/``: within 3 dB on 15 of 20 points; server fans support
52 dB per decade; docs/models.md "Acoustic model").
"""

from __future__ import annotations

import math

FAN_LAW_DB_PER_DECADE = 50.0  # 10·log10 of speed^5


def fan_law_dba(fan_pct: float, rated_dba: float, db_per_decade: float = FAN_LAW_DB_PER_DECADE) -> float:
    """Level of fans at ``fan_pct`` % of full speed whose level at 100 % is ``rated_dba``."""
    return rated_dba + db_per_decade * math.log10(fan_pct / 100) if fan_pct > 0 else -math.inf
