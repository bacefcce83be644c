"""Which packages a project needs: what it declares, plus what its code imports that the declaration lacks.

Python: requirements.txt, then pyproject.toml [project].dependencies; Node: package.json dependencies.
Beside them, the top-level names of `import` / `from ... import` (found with ast) minus the standard
library and the project's own modules, or bare `require('x')` / `import ... from 'x'` names minus
node: builtins, mapped through the vetted table: those not declared yet are `added` (and installed)
on every run, not just the first, unless codeyard.toml says `[packages] auto_install = false`.
Names the vetted table does not know are reported, never guessed.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import tomllib
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from sandbox.languages import CONFIG_FILE, read_config_table
from sandbox.packages import vetted

MAX_SOURCE_BYTES = 1 << 20
PACKAGE_JSON = "package.json"
SKIPPED_DIRS = {"node_modules", "__pycache__", "venv", ".venv"}
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")  # PEP 508 distribution name
_JS_SPECIFIER = re.compile(r"""(?:\brequire\s*\(\s*|\bimport\s*\(\s*|\bfrom\s+|\bimport\s+)(['"])([^'"\n]+)\1""")
_NODE_BUILTINS = frozenset({
    "assert", "buffer", "child_process", "cluster", "console", "crypto", "dgram", "dns", "events", "fs", "http",
    "http2", "https", "module", "net", "os", "path", "perf_hooks", "process", "querystring", "readline", "repl",
    "stream", "string_decoder", "timers", "tls", "tty", "url", "util", "v8", "vm", "worker_threads", "zlib",
})


@dataclass(frozen=True)
class Resolution:
    """requirements: what to install (PEP 508 strings, or npm specs); unknown: imports with no known package."""

    requirements: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    declared: bool = False  # the project has requirements.txt / pyproject.toml / package.json
    added: tuple[tuple[str, str], ...] = ()  # (import, package) the code needs and the declaration lacks
    auto_install: bool = True  # added packages are among `requirements` (else only reported)
    unchecked: tuple[str, ...] = ()  # a declaring Python project's unknown imports: its packages may provide them


def is_package_name(name: str) -> bool:
    """A bare PEP 508 distribution name: no version, URL, path or option."""
    return bool(_NAME.match(name)) and len(name) <= 200


def _files(project_dir: Path, suffixes: tuple[str, ...]) -> Iterator[tuple[Path, str]]:
    """(path, text) of the project's source files, without following links or reading huge files."""
    for root, dirs, names in os.walk(project_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS
                   and not os.path.islink(os.path.join(root, d))]
        for name in names:
            path = Path(root, name)
            if path.suffix in suffixes and not path.is_symlink() and path.stat().st_size <= MAX_SOURCE_BYTES:
                yield path, path.read_text(errors="replace")


def _requirement(line: str, source: str) -> str:
    if line.startswith("-"):
        raise ValueError(f"{source}: options such as {line.split()[0]!r} are not supported; list package names only")
    try:
        requirement = Requirement(line)
    except InvalidRequirement as exc:
        raise ValueError(f"{source}: {line!r} is not a valid requirement ({exc})") from None
    if requirement.url:
        raise ValueError(f"{source}: {line!r}: URL requirements are not supported; use a name from PyPI")
    return str(requirement)


def declared_python(project_dir: Path) -> tuple[str, ...] | None:
    """requirements.txt, else pyproject.toml [project].dependencies; None when neither declares any."""
    path = project_dir / "requirements.txt"
    if path.is_file() and not path.is_symlink():
        lines = (line.split("#", 1)[0].strip() for line in path.read_text(errors="replace").splitlines())
        return tuple(_requirement(line, "requirements.txt") for line in lines if line)
    path = project_dir / "pyproject.toml"
    if path.is_file() and not path.is_symlink():
        try:
            dependencies = tomllib.loads(path.read_text()).get("project", {}).get("dependencies")
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"pyproject.toml: {exc}") from None
        if dependencies is not None:
            if not isinstance(dependencies, list) or not all(isinstance(d, str) for d in dependencies):
                raise ValueError("pyproject.toml: project.dependencies must be a list of strings")
            return tuple(_requirement(d, "pyproject.toml") for d in dependencies)
    return None


def local_modules(project_dir: Path) -> set[str]:
    """Names the project itself provides: every .py file's stem and every folder holding .py files."""
    names = set()
    for path, _ in _files(project_dir, (".py",)):
        names.add(path.stem)
        names.update(p.name for p in path.relative_to(project_dir).parents if p.name)
    return names


def python_imports(project_dir: Path) -> set[str]:
    """Top-level names of absolute imports in the project's .py files (files that don't parse are skipped)."""
    names: set[str] = set()
    for _, text in _files(project_dir, (".py",)):
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def auto_install(project_dir: Path) -> bool:
    """codeyard.toml `[packages] auto_install` (default true): whether runs install imports not declared yet."""
    value = read_config_table(project_dir, "packages").get("auto_install", True)
    if not isinstance(value, bool):
        raise ValueError(f"{CONFIG_FILE}: packages.auto_install must be true or false")
    return value


def _added(needed: set[str], table: dict[str, str], declared: AbstractSet[str]) -> tuple[tuple[str, str], ...]:
    """(import, package) for each vetted package the code needs that is not declared, by package name."""
    found: dict[str, str] = {}
    for name in sorted(needed & table.keys()):
        if canonicalize_name(table[name]) not in declared:
            found.setdefault(table[name], name)
    return tuple((name, package) for package, name in sorted(found.items()))


def _resolution(declared: tuple[str, ...] | None, added: tuple[tuple[str, str], ...], unknown: tuple[str, ...],
                project_dir: Path, **extra: tuple[str, ...]) -> Resolution:
    auto = auto_install(project_dir)
    requirements = (*(declared or ()), *(package for _, package in added if auto))
    return Resolution(requirements, unknown, declared is not None, added, auto, **extra)


def resolve_python(project_dir: Path) -> Resolution:
    """What the project's Python code needs (ValueError naming the file for a bad declaration)."""
    declared = declared_python(project_dir)
    needed = python_imports(project_dir) - set(sys.stdlib_module_names) - local_modules(project_dir)
    have = {canonicalize_name(Requirement(r).name) for r in declared or ()}
    strange = tuple(sorted(n for n in needed if n not in vetted.PYTHON and canonicalize_name(n) not in have))
    if declared is None:
        return _resolution(None, _added(needed, vetted.PYTHON, set()), strange, project_dir)
    return _resolution(declared, _added(needed, vetted.PYTHON, have), (), project_dir, unchecked=strange)


def _node_package(specifier: str) -> str | None:
    """The package of a bare specifier ('lodash/fp' -> 'lodash', '@a/b/c' -> '@a/b'); None for others."""
    if specifier.startswith((".", "/", "node:")) or ":" in specifier:
        return None
    parts = specifier.split("/")
    name = "/".join(parts[:2]) if specifier.startswith("@") else parts[0]
    return None if name in _NODE_BUILTINS else name


def read_package_json(project_dir: Path) -> dict[str, Any] | None:
    """The project's package.json (None without one; ValueError when it is not an object with object dependencies)."""
    path = project_dir / PACKAGE_JSON
    if not path.is_file() or path.is_symlink():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"package.json: not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("dependencies", {}), dict):
        raise ValueError("package.json: must be an object whose dependencies are an object")
    return data


def resolve_node(project_dir: Path) -> Resolution:
    """What the project's JavaScript needs: package.json dependencies and vetted bare imports it lacks."""
    data = read_package_json(project_dir)
    dependencies = (data or {}).get("dependencies", {})
    declared = None if data is None else tuple(f"{name}@{spec}" for name, spec in sorted(dependencies.items()))
    needed = {name for _, text in _files(project_dir, (".js", ".mjs", ".cjs"))
              for match in _JS_SPECIFIER.finditer(text) if (name := _node_package(match.group(2)))} - set(dependencies)
    return _resolution(declared, _added(needed, {n: n for n in vetted.NODE}, set()), tuple(sorted(needed - vetted.NODE)),
                       project_dir)
