"""Sandboxed code execution: backends (bubblewrap, Docker, runner nodes), limits, verdicts and file transfer.

This is the package's face: other packages import these names from `sandbox` and nothing from its
modules (an import-linter contract in pyproject.toml says so, with its listed exceptions), so the
modules behind it can move and split without touching their users.

The run services (ProjectRuns, RunQueue and its RunRecord) load the IDE's database and collab
layers, so they are imported when first asked for: a runner node or a CLI that imports the sandbox
does not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from sandbox.app_relay import PipeTo
from sandbox.backend import Backend, ExitStatus, Mount, RunSpec
from sandbox.backends.choice import make_backend
from sandbox.backends.remote_apps import RunnerHosting
from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.files import WorkspaceTooLarge, copy_in
from sandbox.frames import CLOSE_FORBIDDEN, CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED, SOCKET_GONE
from sandbox.friendly import ErrorInfo, error_from_output, explain_error
from sandbox.hosted import Hosted, HostedSpec, Hosting, LocalHosting, Stream, remove_stale_cgroups
from sandbox.languages import CONFIG_FILE, read_config_table
from sandbox.limits import MIB, Limits
from sandbox.packages.install import Installer, InstallFailed, bubblewrap_installer
from sandbox.packages.project import prepare_node, unknown_message
from sandbox.packages.resolve import resolve_python
from sandbox.verdict import RunResult, Verdict

if TYPE_CHECKING:
    from sandbox.run_queue import RunQueue, RunRecord
    from sandbox.service import ProjectRuns

_RUN_SERVICES = {"ProjectRuns": "sandbox.service", "RunQueue": "sandbox.run_queue", "RunRecord": "sandbox.run_queue"}

__all__ = [
    # running code: a backend (chosen from the settings), what to run, with which limits, and its result
    "Backend", "Mount", "RunSpec", "make_backend", "Limits", "MIB", "RunResult", "Verdict",
    "SandboxError", "SandboxUnavailable",
    # the IDE's runs: the app-facing service, the queue and its records (loaded on first use)
    "ProjectRuns", "RunQueue", "RunRecord",
    # long-lived processes (deployed apps' instances): on this machine or on runner nodes
    "Hosted", "HostedSpec", "ExitStatus", "Hosting", "LocalHosting", "RunnerHosting", "Stream", "remove_stale_cgroups",
    "PipeTo",
    # files in and out of a sandbox; a project's codeyard.toml
    "copy_in", "WorkspaceTooLarge", "CONFIG_FILE", "read_config_table",
    # packages for runs and deploys
    "Installer", "InstallFailed", "bubblewrap_installer", "prepare_node", "unknown_message", "resolve_python",
    # a run's error in plain words (the grader's feedback, the assistant's Explain)
    "ErrorInfo", "error_from_output", "explain_error",
    # the WebSocket close codes and errors the sockets share
    "SOCKET_GONE", "CLOSE_FORBIDDEN", "CLOSE_NOT_FOUND", "CLOSE_UNAUTHENTICATED",
]


def __getattr__(name: str) -> object:
    if name in _RUN_SERVICES:
        return getattr(importlib.import_module(_RUN_SERVICES[name]), name)
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
