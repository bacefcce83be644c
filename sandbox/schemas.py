"""Request and response bodies of the runs API (Create/Public, as in the rest of the app)."""

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, StrictBool, field_validator

from ide_server import paths
from sandbox.limits import Limits, asked_limit

LimitName = Literal[tuple(Limits.__dataclass_fields__)]  # type: ignore[valid-type]


def _shown(text: str) -> str:
    """Text read back from a run record: one stored by an older server may hold raw bytes of a file name
    (lone surrogates), which no JSON answer can carry; they are shown as backslash escapes instead."""
    return text.encode("utf-8", "backslashreplace").decode()


ShownText = Annotated[str, AfterValidator(_shown)]
# files_written as the file tree shows them; old records may hold names copy_out now refuses
ShownPath = Annotated[str, AfterValidator(paths.escape)]


class RunCreate(BaseModel):
    """Start a run. entry: the file to run (default: codeyard.toml's [run] or main.py, index.js...).
    stdin: the whole input, sent then closed; leave it out to type input over /ws/runs/{id}.
    interactive: someone types the input (the editor's console): the wall clock stands still while the
    program waits for input, up to 10 minutes per wait; other limits are unchanged.
    limits: lower (or, up to the server maxima, raise) any limit for this run."""

    entry: str | None = Field(default=None, max_length=1000)
    stdin: str | None = Field(default=None, max_length=1 << 20)
    interactive: StrictBool = False
    limits: dict[LimitName, float] = Field(default_factory=dict, description=(  # type: ignore[valid-type]
        "Each a finite number above 0 (at least 1 for counts and bytes) and at most 2**53; "
        "above the server maximum it is lowered to it."))

    @field_validator("limits")
    @classmethod
    def _finite_limits(cls, limits: dict[str, float]) -> dict[str, float]:
        """NaN and infinities pass as floats; refuse them here, naming the limit (see sandbox.limits)."""
        return {name: asked_limit(name, value) for name, value in limits.items()}


class RunPublic(BaseModel):
    id: str
    project_id: str
    status: Literal["queued", "running", "finished"]
    queue_position: int | None = Field(default=None, description="While queued: how many runs start before it, plus one "
                                       "(runs start round-robin between users)")
    waiting_for_input: bool = Field(default=False, description="While running: the program waits for input (an "
                                    "interactive run's wall clock stands still meanwhile)")
    listening_port: int | None = Field(default=None, description="While running: the TCP port the program serves on")
    preview_url: str | None = Field(default=None, description="While it serves: where the run's Webview opens it "
                                    "(a secret path; only the project's members see it)")
    username: str | None = Field(default=None, description="Who started it, in the run list (a workspace opened "
                                 "mid-run follows the live one and names them)")
    argv: list[ShownText]
    verdict: str | None
    exit_code: int | None
    signal: int | None
    cpu_seconds: float | None
    wall_seconds: float | None
    peak_memory_bytes: int | None
    stdout: str
    stderr: str
    output_truncated: bool = Field(description="stdout/stderr here are cut to the first part; the run's own output limit is separate")
    files_written: list[ShownPath]
    message: ShownText
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class PackagesAdd(BaseModel):
    """Install packages from PyPI into the project and list them in requirements.txt."""

    names: list[str] = Field(min_length=1, max_length=20, description="Distribution names only, e.g. ['requests']")


class PackagesPublic(BaseModel):
    requirements: list[str] = Field(description="requirements.txt as it is now")
    installed: dict[str, str] = Field(description="Every installed distribution and its version")
