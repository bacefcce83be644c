"""Resource limits of one run, and how a request is clamped to the server's maxima.

A limit someone asks for (the runs API, codeyard.toml) is a finite number above zero (at least 1
for counts and bytes) and at most MAX_ASKED; past the server maximum it is lowered to it. NaN and
infinities are refused, not clamped: `min(nan, x)` is nan and `int(inf)` raises, so either would
only fail later, inside a run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
MAX_ASKED = 2**53  # the largest whole number a JSON number (a float) carries exactly


@dataclass(frozen=True)
class Limits:
    """What one run may use. Every field is an upper bound enforced by the backend."""

    cpu_seconds: float = 5.0
    wall_seconds: float = 10.0
    memory_bytes: int = 256 * MIB
    pids: int = 64  # processes and threads together
    output_bytes: int = 1 * MIB  # stdout + stderr; the run is stopped past it
    file_bytes: int = 16 * MIB  # largest single file (RLIMIT_FSIZE)
    open_files: int = 256
    disk_bytes: int = 64 * MIB  # workspace quota
    files_count: int = 2000  # files copied into / out of the workspace

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or value <= 0:
                raise ValueError(f"limits.{field.name} must be a positive finite number, got {value!r}")

    def clamp(self, maxima: Limits) -> Limits:
        """The same limits with each field lowered to the server maximum where it asks for more."""
        return Limits(**{f.name: min(getattr(self, f.name), getattr(maxima, f.name)) for f in dataclasses.fields(self)})

    def with_overrides(self, overrides: Mapping[str, Any], maxima: Limits) -> Limits:
        """Apply user-supplied overrides (e.g. from codeyard.toml), then clamp to the server maxima."""
        values = dataclasses.asdict(self)
        for key, value in overrides.items():
            values[key] = asked_limit(key, value)
        return Limits(**values).clamp(maxima)


def _finite(value: int | float) -> bool:
    return not isinstance(value, float) or math.isfinite(value)  # an int is finite, however large


_WHOLE = frozenset(f.name for f in dataclasses.fields(Limits) if f.type == "int")


def asked_limit(name: str, value: object) -> int | float:
    """A limit someone asked for, as Limits holds it; ValueError naming the field when it is not one
    (see the module's docstring for the bounds)."""
    if name not in Limits.__dataclass_fields__:
        raise ValueError(f"limits.{name} is not a known limit (known: {', '.join(sorted(Limits.__dataclass_fields__))})")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"limits.{name} must be a number, got {value!r}")
    if not _finite(value):
        raise ValueError(f"limits.{name} must be a finite number, got {value!r}")
    if value <= 0 or (name in _WHOLE and value < 1):
        raise ValueError(f"limits.{name} must be a positive number{' (at least 1)' if name in _WHOLE else ''}, got {value!r}")
    if value > MAX_ASKED:
        raise ValueError(f"limits.{name} must be at most {MAX_ASKED} (the server lowers it to its maximum anyway), "
                         f"got {value!r}")
    return int(value) if name in _WHOLE else float(value)


SERVER_MAXIMA = Limits(
    cpu_seconds=30.0,
    wall_seconds=60.0,
    memory_bytes=1024 * MIB,
    pids=256,
    output_bytes=8 * MIB,
    file_bytes=64 * MIB,
    open_files=1024,
    disk_bytes=256 * MIB,
    files_count=10000,
)
