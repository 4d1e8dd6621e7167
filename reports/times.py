"""Times as the reports read them: epoch seconds, a datetime (naive means UTC) or ISO text."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def to_epoch(value: Any) -> float | None:
    """Epoch seconds of `value`, or None when it is missing or not a time."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    try:
        return to_epoch(datetime.fromisoformat(str(value)))
    except ValueError:
        return None
