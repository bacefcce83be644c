"""How a run ended, and what it used."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Verdict(str, enum.Enum):
    OK = "ok"
    RUNTIME_ERROR = "runtime_error"
    TIME_LIMIT = "time_limit"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    CANCELLED = "cancelled"
    INTERNAL_ERROR = "internal_error"


@dataclass
class RunResult:
    """The one outcome of a run. `exit_code` or `signal` explain a runtime_error."""

    verdict: Verdict
    exit_code: int | None = None
    signal: int | None = None
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    peak_memory_bytes: int = 0  # 0 where no cgroup could be made (then unknown)
    stdout: bytes = b""  # kept up to the output limit
    stderr: bytes = b""
    files_written: list[str] = field(default_factory=list)  # workspace-relative paths copied back
    files_skipped: list[str] = field(default_factory=list)  # symlinks, special files, over-limit files
    message: str = ""  # human-readable reason for internal_error and limits
