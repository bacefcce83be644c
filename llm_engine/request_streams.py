"""The asyncio side of serving an engine that runs elsewhere (a thread, or the engine-core process):
each request's outputs reach its caller's event loop through a queue, and the waiting-queue bound,
the abort of a request whose caller left, and the step callback work the same either way.

Subclasses say how a command reaches the engine (`_submit`) and when the engine is ready
(`check_ready`); whoever reads the engine's steps calls `report_step`, `fail` and `fail_all`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import TYPE_CHECKING, Final

from llm_engine import precise_sleep
from llm_engine.beam_search import BeamSearchParams
from llm_engine.cpu_contention import others_runnable
from llm_engine.engine_loop import ADMISSION_HOLD_S, AbortRequest, AddRequest, Command
from llm_engine.outputs import RequestOutput
from llm_engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from llm_engine.llm_engine import EngineStats
    from llm_engine.multimodal.inputs import ImagePrompt

StepCallback = Callable[["EngineStats", list[RequestOutput]], None]

# How long a request that finds the engine idle and no other request on its way waits before it
# goes on to `generate` (`wait_for_burst`). A client on the server's CPU (the IDE's assistant, a
# benchmark) is preempted by the server as soon as its burst's first request is written: the server
# took that one to an idle engine alone, which stepped it alone, and the burst's other requests,
# written a few ms later, waited for that step (traced: 2 first steps in most bursts of 12).
# Stepping aside for a moment lets them in first, and the engine's hold then takes them all in one
# step. An isolated request pays this once, and only when the engine is idle: LONE_WINDOW_S (a
# timerfd, `precise_sleep`: ~0.25-0.45 ms), then LONE_WINDOW_OTHERS_RUNNABLE_S in all if, when the short
# window ends, any task besides this thread is runnable (`cpu_contention.others_runnable`): a
# burst's writer still at work, or waiting a scheduler slice for a CPU (stop 30's step aside, a few
# event-loop passes, split back-to-back bursts under load). Read only at the end (stop 32): as the
# wait starts, the client that just wrote is often still runnable (the server's wake-up preempted
# it; tritonclient's threads at 19 of 24 isolated gRPC requests), and done 0.2 ms later, while a
# burst's writer is still runnable then. The long window is the 1 ms every lone request waited
# until stop 31 (then on the loop's timer: 1.1-2 ms, uvloop's timers count whole ms): about what
# held bursts in CI, no longer for an isolated request under load (2 ms cost it 1.1 ms more there,
# no fewer splits).
LONE_WINDOW_S: Final = 0.0002
LONE_WINDOW_OTHERS_RUNNABLE_S: Final = 0.001
# A request that would close an open burst (below) waits for the next in windows this long.
BURST_WINDOW_S: Final = 0.001
# While a burst is open (requests went to an idle engine saying more follow, and no step has run
# since), the request that would end it (nothing else on its way) waits up to this many windows
# for the next one, and only windows that end within the engine's hold (ADMISSION_HOLD_S, counted
# here from the burst's opening). A gRPC stream delivers a burst's requests a few ms apart: its
# first request, back from its window after the second had gone to the engine, could find nothing
# on its way and close the burst, and the rest waited for a step (bursts of 12 at load ~2: 2-4 of
# 10 split with the engine's longer hold alone, 0 of 10 with both). The last request of every
# burst pays the windows (the engine holds for it): 3 ms at most.
BURST_WINDOWS: Final = 3


class EngineNotReady(RuntimeError):
    """The model is still loading, or failed to load (the message says which)."""


class EngineOverloaded(RuntimeError):
    """The waiting queue is full; retry later."""


class _Stream:
    """Outputs of one request, handed from the engine's reader thread to the caller's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        self.finished = False

    def put(self, item: RequestOutput | Exception) -> None:
        """Hand over an item; a caller whose event loop has closed is gone, so it is dropped."""
        with suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class _Admission:
    """A request between its arrival at a protocol and its first `generate` (or its end without one)."""

    def __init__(self) -> None:
        self.open = True


_ADMISSION: ContextVar[_Admission | None] = ContextVar("llm_admission", default=None)


def _put_each(handed: list[tuple[_Stream, RequestOutput]]) -> None:
    for stream, output in handed:
        stream.queue.put_nowait(output)


class RequestOutputs:
    """One request's outputs as they come (`RequestStreams.open`): an async iterator that ends after
    the final output and raises the request's failure; `aclose` aborts it unless it finished."""

    def __init__(self, streams: RequestStreams, request_id: str, stream: _Stream) -> None:
        self.streams = streams
        self.request_id = request_id
        self.stream = stream
        self.closed = False

    def __aiter__(self) -> RequestOutputs:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.stream.finished or self.closed:
            raise StopAsyncIteration
        item = await self.stream.queue.get()
        if isinstance(item, Exception):
            self.stream.finished = True
            raise item
        if item.finished:
            self.stream.finished = True
        return item

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            if not self.stream.finished:
                self.streams.abort(self.request_id)


class RequestStreams(ABC):
    def __init__(self, max_waiting: int, on_step: StepCallback | None) -> None:
        if max_waiting < 0:
            raise ValueError(f"max_waiting: must be >= 0, got {max_waiting!r}")
        self.max_waiting = max_waiting
        self.on_step = on_step
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._pending_adds = 0
        self._admitting = 0  # requests on their way to `generate` (see `admission`)
        # Requests went to an idle engine saying more follow, and no step has run since: the engine
        # is holding its first step for the rest of the burst (see `wait_for_burst`).
        self._burst_open = False
        self._burst_opened = 0.0  # time.monotonic() when it opened
        self._stats: EngineStats | None = None

    @abstractmethod
    def _submit(self, command: Command) -> None:
        """Send a command to the engine's loop."""

    @abstractmethod
    def check_ready(self) -> None:
        """Raise EngineNotReady unless the engine takes requests."""

    def num_waiting(self) -> int:
        """Requests not yet scheduled: waiting in the engine, or queued for the loop to add."""
        return (self._stats.num_waiting if self._stats else 0) + self._pending_adds

    def stats(self) -> EngineStats | None:
        """The snapshot taken after the loop's latest step (None before the model is loaded)."""
        return self._stats

    @contextmanager
    def admission(self) -> Iterator[None]:
        """Count the caller's request, from its arrival at a protocol (before parsing and tokenizing)
        until its first `generate`, as on its way to the engine. A request sent while others are on
        their way says so (`AddRequest.more`), and an idle engine waits for them before its first
        step, so that a burst is prefilled in one step rather than its first arrival alone first."""
        mark = _Admission()
        with self._lock:
            self._admitting += 1
        token = _ADMISSION.set(mark)
        try:
            yield
        finally:
            _ADMISSION.reset(token)
            self._admitted(mark)

    async def wait_for_burst(self) -> None:
        """Inside `admission`: a request alone (nothing in flight, nothing else on its way) gives the
        rest of a burst a moment to arrive and say so (`_wait_alone`), before it reaches `generate`;
        while the burst it started or joined is open (`_burst_open`), it keeps waiting, a window
        (BURST_WINDOW_S) at a time, BURST_WINDOWS at most, for as long as it would be the one to
        close it."""
        if self._admitting == 1 and not self._streams:
            await self._wait_alone()
        waited = 0
        while self._admitting == 1 and waited < BURST_WINDOWS:
            held = time.monotonic() - self._burst_opened
            if not self._burst_open or held + BURST_WINDOW_S >= ADMISSION_HOLD_S:
                return
            await asyncio.sleep(BURST_WINDOW_S)
            waited += 1

    @staticmethod
    async def _wait_alone() -> None:
        """LONE_WINDOW_S, or LONE_WINDOW_OTHERS_RUNNABLE_S in all when another task is runnable as the
        short window ends (the loop serves on meanwhile: what arrives is taken in)."""
        await precise_sleep.sleep(LONE_WINDOW_S)
        if others_runnable():
            await precise_sleep.sleep(LONE_WINDOW_OTHERS_RUNNABLE_S - LONE_WINDOW_S)

    def _admitted(self, mark: _Admission | None) -> None:
        if mark is not None and mark.open:
            mark.open = False
            with self._lock:
                self._admitting -= 1

    async def generate(self, prompt: str | list[int] | ImagePrompt, sampling_params: SamplingParams | BeamSearchParams,
                       request_id: str, priority: int = 0, more: bool = False,
                       fit_window: bool = False) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's output after each step that changed it (cumulative text/tokens; a
        beam search's completions are its beam_width best beams so far, their text once finished).
        `more`: the caller sends other prompts right behind this one (a batch's rows).
        `fit_window`: the engine tokenizes the prompt and checks it against the context window
        (`AddRequest.fit_window`); a prompt that does not fit raises ContextLengthExceeded.

        Raises EngineNotReady, EngineOverloaded, ValueError (bad prompt/parameters, naming the
        field). Closing the iterator before the final output aborts the request.
        """
        outputs = self.open(prompt, sampling_params, request_id, priority, more, fit_window)
        try:
            async for output in outputs:
                yield output
        finally:
            await outputs.aclose()

    def open(self, prompt: str | list[int] | ImagePrompt, sampling_params: SamplingParams | BeamSearchParams,
             request_id: str, priority: int = 0, more: bool = False, fit_window: bool = False) -> RequestOutputs:
        """`generate`'s checks and its send to the engine, done now (raising what `generate` raises
        before its first output), the outputs to come from the iterator returned: a server learns
        that a request is on its way, and may answer the client's headers, before the first token.
        Its `aclose` aborts the request unless it finished, whether any output was read or not."""
        self.check_ready()
        stream = _Stream(asyncio.get_running_loop())
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"request_id: {request_id!r} is already in use")
            waiting = self.num_waiting()
            if waiting >= self.max_waiting:
                raise EngineOverloaded(f"the server is busy: {waiting} requests are waiting "
                                       f"(limit {self.max_waiting}); retry later")
            idle = not self._streams
            self._streams[request_id] = stream
            self._pending_adds += 1
        self._admitted(_ADMISSION.get())
        more = more or self._admitting > 0
        if more and idle and not self._burst_open:
            self._burst_opened = time.monotonic()  # the engine's hold starts about now
        self._burst_open = more and (idle or self._burst_open)
        self._submit(AddRequest(request_id, prompt, sampling_params, priority, time.time(),
                                more=more, fit_window=fit_window))
        return RequestOutputs(self, request_id, stream)

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op when unknown or finished); its blocks are freed before the next step."""
        self._submit(AbortRequest(request_id))

    def report_step(self, stats: EngineStats, outputs: list[RequestOutput]) -> None:
        """After a step: the stats snapshot, the outputs to their callers, the step callback."""
        self._stats = stats
        self._burst_open = False  # a step ran: the engine holds for nothing now
        self._deliver(outputs)
        if self.on_step is not None:
            self.on_step(stats, outputs)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's outputs over with one wake-up per event loop, not one per request: each
        wake-up is a write to the loop's self-pipe and a GIL hand-off, and a step may feed dozens.
        Read on the callers' own event loop (`EngineCoreClient.start(loop)`), they go straight in."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, RequestOutput]]] = {}
        with self._lock:
            for output in outputs:
                stream = self._streams.get(output.request_id)
                if output.finished:
                    self._streams.pop(output.request_id, None)
                if stream is not None:
                    by_loop.setdefault(stream.loop, []).append((stream, output))
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()  # the reader is that loop
        except RuntimeError:
            here = None
        for loop, handed in by_loop.items():
            if loop is here:
                _put_each(handed)
                continue
            with suppress(RuntimeError):  # that caller's event loop has closed: it is gone
                loop.call_soon_threadsafe(_put_each, handed)

    def fail(self, request_id: str, exc: Exception) -> None:
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put(exc)

    def fail_all(self, exc: Exception) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.put(exc)
