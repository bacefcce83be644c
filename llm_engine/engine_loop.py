"""The engine's serving loop, shared by the in-thread `AsyncLLMEngine` and the engine-core process:
apply the queued commands (add, abort) between steps, step while work remains, report every step.

The host supplies the commands and takes the results; the loop alone decides when to block, so the
two ways of serving cannot drift apart in how a failed step or an idle prefill instance is handled.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from llm_engine.outputs import RequestOutput
from llm_engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from llm_engine.llm_engine import LLMEngine
    from llm_engine.multimodal.inputs import ImagePrompt

log = logging.getLogger("codeyard.llm")


@dataclass
class AddRequest:
    request_id: str
    prompt: str | list[int] | ImagePrompt
    params: SamplingParams
    priority: int
    arrival_time: float


@dataclass
class AbortRequest:
    request_id: str


class NoCommand:
    """Nothing was queued (within the wait, when the loop blocked)."""


NO_COMMAND: Final = NoCommand()
Command = AddRequest | AbortRequest


class LoopHost(Protocol):
    """Where the loop's commands come from and its results go."""

    def next_command(self, block: bool) -> Command | NoCommand | None:
        """The next command (waiting up to a second for one when `block`); None: stop the loop."""

    def added(self, engine: LLMEngine) -> None:
        """A request was added to the engine (its stats changed)."""

    def report(self, engine: LLMEngine, outputs: list[RequestOutput]) -> None:
        """A step ran (or an idle prefill instance released KV holds): hand over its outputs."""

    def idle(self, engine: LLMEngine) -> None:
        """Commands left the engine with nothing to run (the last request aborted): no step follows,
        so the stats are read now."""

    def fail(self, request_id: str, exc: Exception) -> None:
        """One request failed before it ran (bad prompt or parameters)."""

    def fail_all(self, exc: Exception) -> None:
        """Every request in flight failed (a step raised)."""


def run_loop(engine: LLMEngine, host: LoopHost) -> None:
    """Serve until the host says stop; a failed step fails the requests in flight, not the server."""
    while True:
        applied = _apply_commands(engine, host, block=not engine.has_unfinished_requests())
        if applied is None:
            return
        if not engine.has_unfinished_requests():
            if engine.release_kv_holds():  # a prefill instance's transfers end while it idles
                host.report(engine, [])
            elif applied:
                host.idle(engine)
            continue
        try:
            outputs = engine.step()
        except Exception as exc:
            log.exception("LLM engine step failed")
            engine.abort_request(list(engine.requests))
            engine.step()
            host.fail_all(RuntimeError(f"engine step failed: {type(exc).__name__}: {exc}"))
            continue
        host.report(engine, outputs)


def _apply_commands(engine: LLMEngine, host: LoopHost, block: bool) -> int | None:
    """Apply every queued command (waiting for one when idle): how many; None when asked to stop."""
    applied = 0
    while True:
        command = host.next_command(block)
        if command is None:
            return None
        if isinstance(command, NoCommand):
            return applied
        block = False
        applied += 1
        if isinstance(command, AbortRequest):
            engine.abort_request(command.request_id)
            continue
        try:
            engine.add_request(command.request_id, command.prompt, command.params,
                               priority=command.priority, arrival_time=command.arrival_time)
        except ValueError as exc:
            host.fail(command.request_id, exc)
        else:
            host.added(engine)
