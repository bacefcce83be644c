"""Request and response bodies of the runs API (Create/Public, as in the rest of the app)."""

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from sandbox.limits import Limits

LimitName = Literal[tuple(Limits.__dataclass_fields__)]  # type: ignore[valid-type]


class RunCreate(BaseModel):
    """Start a run. entry: the file to run (default: codeyard.toml's [run] or main.py, index.js...).
    stdin: the whole input, sent then closed; leave it out to type input over /ws/runs/{id}.
    limits: lower (or, up to the server maxima, raise) any limit for this run."""

    entry: str | None = Field(default=None, max_length=1000)
    stdin: str | None = Field(default=None, max_length=1 << 20)
    limits: dict[LimitName, float] = Field(default_factory=dict)


class RunPublic(BaseModel):
    id: str
    project_id: str
    status: Literal["queued", "running", "finished"]
    queue_position: int | None = Field(default=None, description="While queued: how many runs start before it, plus one "
                                       "(runs start round-robin between users)")
    argv: list[str]
    verdict: str | None
    exit_code: int | None
    signal: int | None
    cpu_seconds: float | None
    wall_seconds: float | None
    peak_memory_bytes: int | None
    stdout: str
    stderr: str
    output_truncated: bool = Field(description="stdout/stderr here are cut to the first part; the run's own output limit is separate")
    files_written: list[str]
    message: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class PackagesAdd(BaseModel):
    """Install packages from PyPI into the project and list them in requirements.txt."""

    names: list[str] = Field(min_length=1, max_length=20, description="Distribution names only, e.g. ['requests']")


class PackagesPublic(BaseModel):
    requirements: list[str] = Field(description="requirements.txt as it is now")
    installed: dict[str, str] = Field(description="Every installed distribution and its version")
