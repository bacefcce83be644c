"""Resource limits of one run, and how a request is clamped to the server's maxima."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

MIB = 1024 * 1024


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
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"limits.{field.name} must be a positive number, got {value!r}")

    def clamp(self, maxima: Limits) -> Limits:
        """The same limits with each field lowered to the server maximum where it asks for more."""
        return Limits(**{f.name: min(getattr(self, f.name), getattr(maxima, f.name)) for f in dataclasses.fields(self)})

    def with_overrides(self, overrides: Mapping[str, Any], maxima: Limits) -> Limits:
        """Apply user-supplied overrides (e.g. from codeyard.toml), then clamp to the server maxima."""
        names = {f.name: f.type for f in dataclasses.fields(self)}
        values = dataclasses.asdict(self)
        for key, value in overrides.items():
            if key not in names:
                raise ValueError(f"limits.{key} is not a known limit (known: {', '.join(sorted(names))})")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"limits.{key} must be a number, got {value!r}")
            values[key] = value if key in ("cpu_seconds", "wall_seconds") else int(value)
        return Limits(**values).clamp(maxima)


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
