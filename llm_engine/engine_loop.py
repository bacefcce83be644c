"""The engine's serving loop, shared by the in-thread `AsyncLLMEngine` and the engine-core process:
apply the queued commands (add, abort) between steps, step while work remains, report every step.

The host supplies the commands and takes the results; the loop alone decides when to block, so the
two ways of serving cannot drift apart in how a failed step or an idle prefill instance is handled.
"""

from __future__ import annotations

import logging
import time
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
    # Other requests were on their way to the engine behind this one (a burst the API process is
    # still parsing and tokenizing): an idle engine waits for them before its first step.
    more: bool = False


@dataclass
class AbortRequest:
    request_id: str


class NoCommand:
    """Nothing was queued (within the wait, when the loop blocked)."""


NO_COMMAND: Final = NoCommand()
Command = AddRequest | AbortRequest

IDLE_WAIT_S: Final = 1.0  # an idle loop's wait for a command, after which it looks again
# How long an idle engine holds its first step for the rest of a burst (AddRequest.more). A step costs
# the same whether it prefills one arrival or twelve (a pass over the weights), so starting on the
# first arrival made the rest wait for that step: +19..25% burst TTFT p50 against the offline engine,
# which gets the whole burst before its first step. The bound covers a neighbour that fails its
# checks after the hint went out; a burst of 12 reached the core over 2-25 ms (load 1-7).
ADMISSION_HOLD_S: Final = 0.03


class LoopHost(Protocol):
    """Where the loop's commands come from and its results go."""

    def next_command(self, wait: float) -> Command | NoCommand | None:
        """The next command, waiting up to `wait` seconds for one (0: not at all); None: stop the loop."""

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
        applied = _apply_commands(engine, host, idle=not engine.has_unfinished_requests())
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


def _apply_commands(engine: LLMEngine, host: LoopHost, idle: bool) -> int | None:
    """Apply every queued command: how many; None when asked to stop. An idle engine waits for one,
    and then, while the latest request says more are behind it, for those (up to ADMISSION_HOLD_S)."""
    applied, holding = 0, False
    wait, hold_until = (IDLE_WAIT_S if idle else 0.0), 0.0
    while True:
        command = host.next_command(wait)
        if command is None:
            return None
        if isinstance(command, NoCommand):
            return applied
        applied += 1
        if isinstance(command, AbortRequest):
            engine.abort_request(command.request_id)
        else:
            if idle and command.more and not hold_until:
                hold_until = time.monotonic() + ADMISSION_HOLD_S
            holding = idle and command.more
            try:
                engine.add_request(command.request_id, command.prompt, command.params,
                                   priority=command.priority, arrival_time=command.arrival_time)
            except ValueError as exc:
                host.fail(command.request_id, exc)
            else:
                host.added(engine)
        wait = max(0.0, hold_until - time.monotonic()) if holding else 0.0
