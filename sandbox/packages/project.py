"""A project's packages before a run: resolve, install what is missing, pin (Python), and mount it read-only."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sandbox.backend import Mount
from sandbox.packages.install import Environment, Installer
from sandbox.packages.resolve import Resolution, declared_python, is_package_name, resolve_node, resolve_python

REQUIREMENTS = "requirements.txt"


def unknown_message(names: tuple[str, ...], project_id: str) -> str:
    listed = ", ".join(f"'{n}'" for n in names)
    return (f"No package is known for import {listed}. If you meant a PyPI package, install it with the Install "
            f"button / POST /api/projects/{project_id}/packages (it is then added to {REQUIREMENTS}).")


@dataclass(frozen=True)
class PreparedPackages:
    """What a run needs for its packages: mounts, environment variables, and unknown imports to report."""

    mounts: tuple[Mount, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".codeyard-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _pinned_line(line: str, pins: dict[str, str]) -> str:
    """The line with its exact version, when it names one installed distribution with no range of its own."""
    text, hash_, comment = line.partition("#")
    if not text.strip():
        return line
    requirement = Requirement(text.strip())
    version = pins.get(canonicalize_name(requirement.name))
    if version is None or requirement.extras or requirement.marker or any(s.operator != "==" for s in requirement.specifier):
        return line
    return f"{requirement.name}=={version}" + (f"  #{comment}" if hash_ else "")


def pin_requirements(project_dir: Path, resolution: Resolution, env: Environment) -> tuple[str, ...]:
    """Write the installed versions back to requirements.txt; return the project's requirements now.

    A project with no declaration gets one listing what it imports; a requirements.txt has its
    bare or ==-pinned names updated; a pyproject.toml is left as the user wrote it."""
    path = project_dir / REQUIREMENTS
    if not resolution.declared:
        names = [Requirement(r).name for r in resolution.requirements]
        _write_atomically(path, "".join(f"{n}=={v}\n" if (v := env.pins.get(canonicalize_name(n))) else f"{n}\n" for n in names))
    elif path.is_file() and not path.is_symlink():
        lines = path.read_text().splitlines()
        pinned = [_pinned_line(line, env.pins) for line in lines]
        if pinned != lines:
            _write_atomically(path, "".join(f"{line}\n" for line in pinned))
    return declared_python(project_dir) or ()


async def prepare_python(installer: Installer, project_dir: Path, progress: Callable[[str], None]) -> PreparedPackages:
    """Install (or find cached) what the project needs; ValueError for a bad declaration, InstallFailed."""
    resolution = resolve_python(project_dir)
    if not resolution.requirements:
        return PreparedPackages(unknown=resolution.unknown)
    env = await installer.install(resolution.requirements, progress)
    installer.alias(pin_requirements(project_dir, resolution, env), env)
    return PreparedPackages((env.mount(),), env.env(), resolution.unknown)


async def prepare_node(installer: Installer, project_dir: Path, progress: Callable[[str], None]) -> PreparedPackages:
    """Install (or find cached) the project's Node packages (npm, install scripts off); package.json is not rewritten."""
    resolution = resolve_node(project_dir)
    if not resolution.requirements:
        return PreparedPackages(unknown=resolution.unknown)
    env = await installer.install(resolution.requirements, progress, ecosystem="node")
    return PreparedPackages((env.mount(),), env.env(), resolution.unknown)


async def add_packages(installer: Installer, project_dir: Path, names: list[str],
                       progress: Callable[[str], None] = lambda _: None) -> Environment:
    """Install `names` beside what the project already needs, then list them, pinned, in requirements.txt.

    requirements.txt is written only once the install worked, so a failed one changes nothing."""
    if not names or not all(isinstance(n, str) and is_package_name(n) for n in names):
        raise ValueError("names: give package names only (like 'requests' or 'python-dateutil'), "
                         "not versions, URLs, paths or pip options")
    current = resolve_python(project_dir)
    path = project_dir / REQUIREMENTS
    lines = path.read_text().splitlines() if current.declared and path.is_file() and not path.is_symlink() else list(current.requirements)
    have = {canonicalize_name(Requirement(r).name) for r in current.requirements}
    lines += [n for n in dict.fromkeys(names) if canonicalize_name(n) not in have]
    requirements = tuple(line for line in (l.split("#", 1)[0].strip() for l in lines) if line)
    env = await installer.install(requirements, progress)
    _write_atomically(path, "".join(f"{line}\n" for line in lines))
    installer.alias(pin_requirements(project_dir, Resolution(requirements, (), True), env), env)
    return env
