"""Which command runs a project: from its entry file's language or its codeyard.toml `[run]` section.

    [run]
    entry = "src/app.py"            # optional; otherwise main.py, index.js, main.sh, main.c, ...
    command = ["python3", "src/app.py", "--fast"]   # optional; an argument list (a string is split like a shell would, never run by one)
    [run.limits]
    cpu_seconds = 2                 # any Limits field: a finite number > 0, clamped to the server maxima (sandbox.limits)

C and C++ are compiled into /tmp and run in the same sandbox; the entry path is passed to the
compile script as an argument, never pasted into it.
"""

from __future__ import annotations

import shlex
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ide_server import paths
from sandbox.limits import SERVER_MAXIMA, Limits

CONFIG_FILE = "codeyard.toml"
_COMPILE = 'cc="$1"; shift; "$cc" "$@" -o /tmp/codeyard-main && exec /tmp/codeyard-main'


@dataclass(frozen=True)
class Language:
    name: str
    extensions: tuple[str, ...]

    def argv(self, entry: str) -> list[str]:
        entry = f"./{entry}"  # never read as an option, whatever the file is called
        if self.name == "python":
            return ["python3", entry]
        if self.name == "javascript":
            return ["node", entry]
        if self.name == "bash":
            return ["bash", entry]
        if self.name == "c":
            return ["/bin/sh", "-c", _COMPILE, "sh", "gcc", "-O2", "-std=gnu17", entry, "-lm"]
        return ["/bin/sh", "-c", _COMPILE, "sh", "g++", "-O2", "-std=gnu++17", entry]


LANGUAGES = (
    Language("python", (".py",)),
    Language("javascript", (".js", ".mjs", ".cjs")),
    Language("bash", (".sh",)),
    Language("c", (".c",)),
    Language("cpp", (".cpp", ".cc", ".cxx")),
)
DEFAULT_ENTRIES = ("main.py", "index.js", "main.js", "main.sh", "main.c", "main.cpp")


@dataclass(frozen=True)
class RunPlan:
    argv: list[str]
    limits: Limits
    language: str | None  # None for a custom command


def language_for(entry: str) -> Language:
    suffix = PurePosixPath(entry).suffix.lower()
    for language in LANGUAGES:
        if suffix in language.extensions:
            return language
    known = ", ".join(ext for lang in LANGUAGES for ext in lang.extensions)
    raise ValueError(f"entry: cannot tell how to run {entry!r} (known file types: {known}); set [run] command in {CONFIG_FILE}")


def _check_entry(project_dir: Path, entry: str) -> str:
    path = PurePosixPath(entry)
    if not entry or path.is_absolute() or ".." in path.parts or "\0" in entry:
        raise ValueError(f"entry: {entry!r} must be a relative path inside the project")
    if why := paths.problem(entry):  # its name would reach the run's argv, and every answer that shows it
        raise ValueError(f"entry: {entry!r}: {why}")
    try:
        mode = (project_dir / path).lstat().st_mode
    except OSError:
        raise ValueError(f"entry: {entry!r} does not exist in the project") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"entry: {entry!r} is not a regular file")
    return str(path)


def read_config_table(project_dir: Path, table: str) -> dict[str, Any]:
    """The `[table]` section of the project's codeyard.toml ({} without the file; ValueError if malformed).
    Runs read [run], deploys [deploy]."""
    path = project_dir / CONFIG_FILE
    if not path.is_file() or path.is_symlink():
        return {}
    try:
        config = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{CONFIG_FILE}: {exc}") from None
    section = config.get(table, {})
    if not isinstance(section, dict):
        raise ValueError(f"{CONFIG_FILE}: [{table}] must be a table")
    return section


def plan_run(project_dir: Path, entry: str | None = None, *, defaults: Limits = Limits(), maxima: Limits = SERVER_MAXIMA) -> RunPlan:
    """The command and limits for running this project (ValueError naming the bad field)."""
    config = read_config_table(project_dir, "run")
    overrides = config.get("limits", {})
    if not isinstance(overrides, dict):
        raise ValueError(f"{CONFIG_FILE}: [run.limits] must be a table")
    try:
        limits = defaults.with_overrides(overrides, maxima)
    except ValueError as exc:
        raise ValueError(f"{CONFIG_FILE}: run.{exc}") from None
    command = config.get("command")
    if command is not None and entry is None:
        if isinstance(command, str):
            command = shlex.split(command)
        if not command or not all(isinstance(a, str) for a in command):
            raise ValueError(f"{CONFIG_FILE}: run.command must be a non-empty list of strings")
        return RunPlan(list(command), limits, None)
    entry = entry or config.get("entry")
    if entry is None:
        entry = next((e for e in DEFAULT_ENTRIES if (project_dir / e).is_file()), None)
        if entry is None:
            raise ValueError(f"entry: no entry file (looked for {', '.join(DEFAULT_ENTRIES)}); choose one or set [run] entry in {CONFIG_FILE}")
    if not isinstance(entry, str):
        raise ValueError(f"{CONFIG_FILE}: run.entry must be a string")
    entry = _check_entry(project_dir, entry)
    return RunPlan(language_for(entry).argv(entry), limits, language_for(entry).name)
