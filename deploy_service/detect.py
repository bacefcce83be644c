"""What a deploy runs: the app kind found in the project, or codeyard.toml's `[deploy]` section.

    [deploy]
    build = "npm run build"        # optional; an argument list, or a string split like a shell (never run by one)
    run = ["node", "server.js"]    # optional; otherwise detected (below)
    health = "/healthz"            # optional; the path that must answer (< 500) before traffic switches; "/" by default
    instances = 2                  # optional; 1..MAX_INSTANCES
    memory_mb = 512                # optional; each instance's memory, MIN_MEMORY_MB..MAX_MEMORY_MB (256 by default)
    cpus = 0.5                     # optional; each instance's CPU quota, MIN_CPUS..MAX_CPUS (1 by default)

Detected, in this order: a Flask or FastAPI object assigned at the top level of app.py or main.py,
a Node package.json with a "start" script, a static site with index.html. The app listens on
127.0.0.1:$PORT inside its own network namespace.
"""

from __future__ import annotations

import ast
import json
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sandbox import CONFIG_FILE, read_config_table

PORT = 8080
MAX_INSTANCES = 4
MIN_MEMORY_MB, MAX_MEMORY_MB = 32, 1024
MIN_CPUS, MAX_CPUS = 0.1, 4
PYTHON_ENTRIES = ("app.py", "main.py")
FLASK_SERVER = ("waitress",)  # a production WSGI server (threads, keep-alive), not Flask's development one
FASTAPI_SERVER = ("uvicorn", "websockets")  # uvicorn serves the app; websockets gives it WebSocket support
MAX_SOURCE_BYTES = 1 << 20
# Serves the site's files (keep-alive, threads); never a dotfile (.env, .npmrc) nor a folder listing.
STATIC_SERVER = r"""
import http.server, sys
class Site(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def send_head(self):
        if any(part.startswith(".") for part in self.path.split("?")[0].split("/")):
            self.send_error(404)
            return None
        return super().send_head()
    def list_directory(self, path):
        self.send_error(404)
        return None
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Site).serve_forever()
"""


@dataclass(frozen=True)
class AppPlan:
    """How to build and run one release, and how to tell it is up."""

    kind: str  # flask | fastapi | node | static | custom
    argv: list[str]
    build: list[str] | None = None
    health_path: str = "/"
    instances: int | None = None  # from codeyard.toml; None keeps the deployment's count
    extra_requirements: tuple[str, ...] = field(default=())  # Python packages the server itself needs
    memory_mb: int | None = None  # from codeyard.toml; None: the server's default for apps
    cpus: float = 1.0  # each instance's CPU quota (codeyard.toml deploy.cpus)

    @property
    def ecosystem(self) -> str | None:
        """Which packages to install before it starts (python, node or none)."""
        if self.kind == "static":
            return None
        if self.kind in ("flask", "fastapi") or self.argv[0].startswith("python"):
            return "python"
        if self.kind == "node" or self.argv[0] in ("node", "npm"):
            return "node"
        return None


def _command(value: object, name: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"{CONFIG_FILE}: deploy.{name}: {exc}") from None
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a and "\0" not in a for a in value):
        raise ValueError(f"{CONFIG_FILE}: deploy.{name} must be a non-empty command (a string or a list of strings)")
    return value


def _health(value: object) -> str:
    if not isinstance(value, str) or not value.startswith("/") or len(value) > 200 or any(ord(c) < 33 for c in value):
        raise ValueError(f"{CONFIG_FILE}: deploy.health must be a path starting with / (no spaces), like \"/healthz\"")
    return value


def _read_config(project_dir: Path) -> dict[str, Any]:
    deploy = read_config_table(project_dir, "deploy")
    known = ("build", "run", "health", "instances", "memory_mb", "cpus")
    if unknown := set(deploy) - set(known):
        raise ValueError(f"{CONFIG_FILE}: deploy.{sorted(unknown)[0]} is not a deploy setting (known: {', '.join(known)})")
    return deploy


def _app_object(path: Path) -> tuple[str, str] | None:
    """(kind, variable) of a top-level `x = Flask(...)` / `x = FastAPI(...)` (also flask.Flask, fastapi.FastAPI)."""
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_SOURCE_BYTES:
        return None
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Call):
            func = node.value.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in ("Flask", "FastAPI"):
                return name.lower(), node.targets[0].id
    return None


def _start_script(project_dir: Path) -> str | None:
    path = project_dir / "package.json"
    if not path.is_file() or path.is_symlink():
        return None
    try:
        scripts = json.loads(path.read_text()).get("scripts", {})
    except (ValueError, UnicodeDecodeError, AttributeError):
        raise ValueError("package.json: not valid JSON") from None
    start = scripts.get("start") if isinstance(scripts, dict) else None
    return start if isinstance(start, str) and start.strip() else None


def detect(project_dir: Path) -> AppPlan:
    """The plan for deploying the project in project_dir (ValueError naming what is wrong or missing)."""
    config = _read_config(project_dir)
    build = _command(config["build"], "build") if "build" in config else None
    health = _health(config["health"]) if "health" in config else "/"
    instances = config.get("instances")
    if instances is not None and (isinstance(instances, bool) or not isinstance(instances, int)
                                  or not 1 <= instances <= MAX_INSTANCES):
        raise ValueError(f"{CONFIG_FILE}: deploy.instances must be a whole number from 1 to {MAX_INSTANCES}")
    memory = config.get("memory_mb")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int)
                               or not MIN_MEMORY_MB <= memory <= MAX_MEMORY_MB):
        raise ValueError(f"{CONFIG_FILE}: deploy.memory_mb must be a whole number from {MIN_MEMORY_MB} to {MAX_MEMORY_MB}")
    cpus = config.get("cpus", 1.0)
    if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not MIN_CPUS <= cpus <= MAX_CPUS:
        raise ValueError(f"{CONFIG_FILE}: deploy.cpus must be a number from {MIN_CPUS:g} to {MAX_CPUS:g}")
    plan = _plan(project_dir, config, build, health, instances)
    return replace(plan, memory_mb=memory, cpus=float(cpus))


def _plan(project_dir: Path, config: dict[str, Any], build: list[str] | None, health: str, instances: int | None) -> AppPlan:
    if "run" in config:
        return AppPlan("custom", _command(config["run"], "run"), build, health, instances)
    for entry in PYTHON_ENTRIES:
        if found := _app_object(project_dir / entry):
            kind, variable = found
            target = f"{Path(entry).stem}:{variable}"
            if kind == "flask":
                argv = ["python3", "-m", "waitress", "--listen", f"127.0.0.1:{PORT}", target]
                return AppPlan("flask", argv, build, health, instances, FLASK_SERVER)
            argv = ["python3", "-m", "uvicorn", target, "--host", "127.0.0.1", "--port", str(PORT), "--no-access-log"]
            return AppPlan("fastapi", argv, build, health, instances, FASTAPI_SERVER)
    if start := _start_script(project_dir):
        return AppPlan("node", ["/bin/sh", "-c", start], build, health, instances)
    if (project_dir / "index.html").is_file():
        return AppPlan("static", ["python3", "-c", STATIC_SERVER, str(PORT)], build, health, instances)
    raise ValueError(
        "project: nothing to deploy found (a Flask or FastAPI app in app.py or main.py, a package.json with a "
        f"\"start\" script, or an index.html); or say how to run it in {CONFIG_FILE} under [deploy] run = ...")
