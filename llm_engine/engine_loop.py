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

from llm_engine.beam_search import BeamSearchParams
from llm_engine.outputs import RequestOutput
from llm_engine.sampling_params import SamplingParams
from llm_engine.step_trace import StepTrace

if TYPE_CHECKING:
    from llm_engine.llm_engine import LLMEngine
    from llm_engine.multimodal.inputs import ImagePrompt

log = logging.getLogger("codeyard.llm")


@dataclass
class AddRequest:
    request_id: str
    prompt: str | list[int] | ImagePrompt
    params: SamplingParams | BeamSearchParams  # a beam search: one beam group in the engine
    priority: int
    arrival_time: float
    # Other requests were on their way to the engine behind this one (a burst the API process is
    # still parsing): an idle engine waits for them before its first step.
    more: bool = False
    # The prompt is as the client sent it (text or token ids): the loop tokenizes it and refuses it
    # when it does not fit the context window with max_tokens, as the servers check the prompts they
    # tokenize themselves. Here it costs the engine's CPU while it waits for a burst, not the API
    # process's, which takes a burst's requests in one after another (the offline engine, too,
    # tokenizes on its own thread).
    fit_window: bool = False


@dataclass
class AbortRequest:
    request_id: str


class ContextLengthExceeded(ValueError):
    """A prompt, with its max_tokens, does not fit the context window; `param` is the field to blame."""

    def __init__(self, message: str, param: str = "prompt") -> None:
        super().__init__(message)
        self.param = param


def check_window(max_model_len: int, prompt_len: int, max_tokens: int | None) -> None:
    """Refuse an empty prompt, one that leaves no room to generate, or a max_tokens past the window."""
    if not prompt_len:
        raise ValueError("prompt: must not be empty")
    room = max_model_len - prompt_len
    if room < 1:
        raise ContextLengthExceeded(f"This model's maximum context length is {max_model_len} tokens; "
                                    f"the prompt has {prompt_len} tokens")
    if max_tokens is not None and max_tokens > room:
        raise ContextLengthExceeded(f"This model's maximum context length is {max_model_len} tokens; you "
                                    f"requested {prompt_len} prompt + {max_tokens} completion tokens", "max_tokens")


class NoCommand:
    """Nothing was queued (within the wait, when the loop blocked)."""


NO_COMMAND: Final = NoCommand()
Command = AddRequest | AbortRequest

IDLE_WAIT_S: Final = 1.0  # an idle loop's wait for a command, after which it looks again
# How long an idle engine holds its first step for the rest of a burst (AddRequest.more). A step costs
# the same whether it prefills one arrival or twelve (a pass over the weights), so starting on the
# first arrival made the rest wait for that step: +19..25% burst TTFT p50 against the offline engine,
# which gets the whole burst before its first step. The bound covers a neighbour that fails its
# checks after the hint went out; a burst of 12 reached the core over 2-25 ms (load 1-7). The bound
# runs from the latest request that said more, not the first, and is 50 ms, not 30: a gRPC stream's
# burst of 12 took 35-70 ms to come in at load ~2 (its client sends from a thread on the CPU the
# server shares), and a hold of 30 ms from the first arrival stepped the first 1-5 alone in 3 of 10
# bursts (0 of 10 with this and `request_streams.BURST_WINDOWS`; either alone: 2-4 of 10).
ADMISSION_HOLD_S: Final = 0.05
ADMISSION_HOLD_MAX_S: Final = 0.1  # a burst still coming in after this is stepped as it stands


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
    trace = StepTrace.from_env()
    try:
        _serve(engine, host, trace)
    finally:
        if trace is not None:
            trace.close()


def _serve(engine: LLMEngine, host: LoopHost, trace: StepTrace | None) -> None:
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
            if trace is not None:
                trace.begin()
            outputs = engine.step()
            if trace is not None:
                trace.end(engine.last_iteration_tokens, outputs)
        except Exception as exc:
            log.exception("LLM engine step failed")
            engine.abort_request(list(engine.requests))
            engine.step()
            host.fail_all(RuntimeError(f"engine step failed: {type(exc).__name__}: {exc}"))
            continue
        host.report(engine, outputs)


def _apply_commands(engine: LLMEngine, host: LoopHost, idle: bool) -> int | None:
    """Apply every queued command: how many; None when asked to stop. An idle engine waits for one,
    and then, while the latest request says more are behind it, for those (up to ADMISSION_HOLD_S
    after the latest such request, ADMISSION_HOLD_MAX_S in all)."""
    applied, holding = 0, False
    wait, hold_until, held_since = (IDLE_WAIT_S if idle else 0.0), 0.0, 0.0
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
            if idle and command.more:
                now = time.monotonic()
                held_since = held_since or now
                hold_until = min(now + ADMISSION_HOLD_S, held_since + ADMISSION_HOLD_MAX_S)
            holding = idle and command.more
            try:
                prompt = _fitted(engine, command) if command.fit_window else command.prompt
                engine.add_request(command.request_id, prompt, command.params,
                                   priority=command.priority, arrival_time=command.arrival_time)
            except ValueError as exc:
                host.fail(command.request_id, exc)
            else:
                host.added(engine)
        wait = max(0.0, hold_until - time.monotonic()) if holding else 0.0


def _fitted(engine: LLMEngine, command: AddRequest) -> list[int]:
    """The prompt's token ids, checked against the context window (AddRequest.fit_window)."""
    assert isinstance(command.prompt, (str, list)), "a prompt with images is checked by the server"
    ids = engine.tokenize(command.prompt)[1]
    check_window(engine.max_model_len, len(ids), command.params.max_tokens)
    return ids
