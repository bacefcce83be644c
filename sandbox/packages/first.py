"""Runs of Python and Node code get their packages first: installed (pip's output on the run's console as
"install" output) and mounted read-only, on the same run handle the queue already gave out."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from sandbox.backend import Backend, ExitStatus, OutputChunk, RunSpec, SandboxRun
from sandbox.packages.install import Installer, InstallFailed
from sandbox.packages.project import PreparedPackages, prepare_node, prepare_python, unknown_message
from sandbox.verdict import RunResult, Verdict

log = logging.getLogger(__name__)
CANCEL_POLL_SECONDS = 0.2
PREPARE = {"python3": prepare_python, "python": prepare_python, "node": prepare_node}


class PackagesFirst:
    """What RunQueue starts runs on: `backend`, with a Python or Node run's packages prepared before it starts."""

    def __init__(self, backend: Backend, installer: Installer) -> None:
        self.backend, self.installer = backend, installer
        self.name = backend.name

    async def start(self, spec: RunSpec) -> SandboxRun:
        if spec.argv[0] not in PREPARE or spec.tty:
            return await self.backend.start(spec)
        run = SandboxRun(spec.limits, spec.tty)
        run._task = asyncio.create_task(self._prepare_then_run(run, spec))
        return run

    async def _prepare_then_run(self, run: SandboxRun, spec: RunSpec) -> RunResult:
        began = time.monotonic()

        def say(text: str) -> None:
            if text:
                run._queue.put_nowait(OutputChunk("install", text.encode()))

        def ended(verdict: Verdict, message: str) -> RunResult:
            run._queue.put_nowait(None)
            return run._result(verdict, ExitStatus(), time.monotonic() - began, message)

        preparing = asyncio.create_task(PREPARE[spec.argv[0]](self.installer, spec.project_dir, say))
        while not preparing.done():  # a cancel of the run stops its install
            await asyncio.wait({preparing}, timeout=CANCEL_POLL_SECONDS)
            if run.cancelled:
                preparing.cancel()
        if preparing.cancelled():
            return ended(Verdict.CANCELLED, "cancelled while installing packages")
        try:
            prepared = preparing.result()
        except (ValueError, InstallFailed) as exc:  # a bad declaration, or pip could not install it
            return ended(Verdict.RUNTIME_ERROR, str(exc))
        except Exception as exc:
            log.exception("preparing the packages of run %s failed", run.id)
            return ended(Verdict.INTERNAL_ERROR, f"package install error: {exc}")
        result = await self.backend._drive(run, _with_packages(spec, prepared))
        notices = (*prepared.notes, *([unknown_message(prepared.unknown, spec.project_dir.name)] if prepared.unknown else []))
        result.message = "\n".join((result.message, *notices)).strip()
        return result


def _with_packages(spec: RunSpec, prepared: PreparedPackages) -> RunSpec:
    return dataclasses.replace(spec, env={**spec.env, **prepared.env}, mounts=(*spec.mounts, *prepared.mounts))
