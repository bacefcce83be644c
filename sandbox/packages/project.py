"""A project's packages before a run: resolve, install what is missing, declare it pinned, and mount it read-only."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sandbox.backend import Mount
from sandbox.packages.install import Ecosystem, Environment, Installer
from sandbox.packages.resolve import (
    PACKAGE_JSON,
    Resolution,
    declared_python,
    is_package_name,
    read_package_json,
    resolve_node,
    resolve_python,
)

REQUIREMENTS = "requirements.txt"
PYPROJECT = "pyproject.toml"


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
    notes: tuple[str, ...] = ()  # for the run's message: packages the code needs that were not installed, and why


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


def _pinned_name(name: str, pins: dict[str, str]) -> str:
    return f"{name}=={version}" if (version := pins.get(canonicalize_name(name))) else name


def _declares_in_pyproject(project_dir: Path, resolution: Resolution) -> bool:
    path = project_dir / REQUIREMENTS
    return resolution.declared and not (path.is_file() and not path.is_symlink())


def pin_requirements(project_dir: Path, resolution: Resolution, env: Environment) -> tuple[str, ...]:
    """Write the installed versions to requirements.txt, adding what the code imports that it lacked; return
    the requirements the environment now answers for.

    A project with no declaration gets one; a requirements.txt has its bare or ==-pinned names updated and
    the added packages appended; a pyproject.toml is left as the user wrote it (the run says what to add)."""
    if _declares_in_pyproject(project_dir, resolution):
        return resolution.requirements
    path = project_dir / REQUIREMENTS
    lines = path.read_text().splitlines() if resolution.declared else []
    added = [_pinned_name(package, env.pins) for _, package in resolution.added] if resolution.auto_install else []
    pinned = [*(_pinned_line(line, env.pins) for line in lines), *added]
    if pinned != lines:
        _write_atomically(path, "".join(f"{line}\n" for line in pinned))
    return declared_python(project_dir) or ()


def _say_added(resolution: Resolution, declaration: str, progress: Callable[[str], None]) -> tuple[str, ...]:
    """Tell the console which packages are installed because the code imports them; notes for those that are not."""
    if not resolution.auto_install:
        return tuple(f"'{name}' needs the package {package}, which {declaration} does not list and codeyard.toml's "
                     f"[packages] auto_install = false keeps from being installed: add it to {declaration}"
                     for name, package in resolution.added)
    keep = f"add it to {declaration} to keep it" if declaration == PYPROJECT else f"adding it to {declaration}, pinned"
    for name, package in resolution.added:
        progress(f"Your code uses '{name}' and {declaration} does not list {package} yet: installing it ({keep}).\n")
    return ()


def _provides(env: Environment | None, name: str) -> bool:
    site = env.site if env is not None else None
    return site is not None and ((site / name).is_dir() or (site / f"{name}.py").is_file() or any(site.glob(f"{name}.*.so")))


async def prepare_python(installer: Installer, project_dir: Path, progress: Callable[[str], None]) -> PreparedPackages:
    """Install (or find cached) what the project needs; ValueError for a bad declaration, InstallFailed."""
    resolution = resolve_python(project_dir)
    notes = _say_added(resolution, PYPROJECT if _declares_in_pyproject(project_dir, resolution) else REQUIREMENTS, progress)
    env = None
    if resolution.requirements:
        env = await installer.install(resolution.requirements, progress)
        installer.alias(pin_requirements(project_dir, resolution, env), env)
    unknown = (*resolution.unknown, *(n for n in resolution.unchecked if not _provides(env, n)))
    if env is None:
        return PreparedPackages(unknown=unknown, notes=notes)
    return PreparedPackages((env.mount(),), env.env(), unknown, notes)


def installed_for(installer: Installer, project_dir: Path) -> PreparedPackages:
    """The environments the project's runs use, if installed (nothing is installed here): the Shell mounts them,
    so `pip list` and `python3 -c "import x"` there see what runs see."""
    mounts: list[Mount] = []
    env: dict[str, str] = {}
    resolvers: tuple[tuple[Callable[[Path], Resolution], Ecosystem], ...] = (
        (resolve_python, "python"), (resolve_node, "node"))
    for resolve, ecosystem in resolvers:
        try:
            resolution = resolve(project_dir)
        except ValueError:  # a bad declaration: the next run says what is wrong
            continue
        if resolution.requirements and (found := installer.cached(resolution.requirements, ecosystem)) is not None:
            mounts.append(found.mount())
            env.update(found.env())
    return PreparedPackages(tuple(mounts), env)


def pin_package_json(project_dir: Path, resolution: Resolution, env: Environment) -> tuple[str, ...]:
    """Add the packages installed for the code's imports to package.json's dependencies, at their installed
    versions (creating package.json where there is none); return the requirements the environment answers for."""
    added = {package: env.pins[package] for _, package in resolution.added if package in env.pins}
    if not added:
        return resolution.requirements
    data = read_package_json(project_dir) or {}
    dependencies = {**data.get("dependencies", {}), **added}
    _write_atomically(project_dir / PACKAGE_JSON, json.dumps({**data, "dependencies": dependencies}, indent=2) + "\n")
    return tuple(f"{name}@{spec}" for name, spec in sorted(dependencies.items()))


async def prepare_node(installer: Installer, project_dir: Path, progress: Callable[[str], None]) -> PreparedPackages:
    """Install (or find cached) the project's Node packages (npm, install scripts off), adding what the code
    requires to package.json."""
    resolution = resolve_node(project_dir)
    notes = _say_added(resolution, PACKAGE_JSON, progress)
    if not resolution.requirements:
        return PreparedPackages(unknown=resolution.unknown, notes=notes)
    env = await installer.install(resolution.requirements, progress, ecosystem="node")
    if resolution.auto_install:
        installer.alias(pin_package_json(project_dir, resolution, env), env)
    return PreparedPackages((env.mount(),), env.env(), resolution.unknown, notes)


async def add_packages(installer: Installer, project_dir: Path, names: list[str],
                       progress: Callable[[str], None] = lambda _: None) -> Environment:
    """Install `names` beside what the project already needs, then list them, pinned, in requirements.txt.

    requirements.txt is written only once the install worked, so a failed one changes nothing."""
    if not names or not all(isinstance(n, str) and is_package_name(n) for n in names):
        raise ValueError("names: give package names only (like 'requests' or 'python-dateutil'), "
                         "not versions, URLs, paths or pip options")
    current = resolve_python(project_dir)
    path = project_dir / REQUIREMENTS
    in_file = current.declared and path.is_file() and not path.is_symlink()
    lines = path.read_text().splitlines() if in_file else []
    listed = {canonicalize_name(Requirement(r).name) for r in declared_python(project_dir) or ()} if in_file else set()
    for requirement in (*current.requirements, *names):  # what runs would install anyway, then the names asked for
        if (name := canonicalize_name(Requirement(requirement).name)) not in listed:
            lines.append(requirement)
            listed.add(name)
    requirements = tuple(line for line in (l.split("#", 1)[0].strip() for l in lines) if line)
    env = await installer.install(requirements, progress)
    _write_atomically(path, "".join(f"{line}\n" for line in lines))
    installer.alias(pin_requirements(project_dir, Resolution(requirements, (), True), env), env)
    return env
