"""AsyncLLMEngine: the engine loop in its own thread, driven by asyncio callers.

The loop thread owns the LLMEngine: it loads the model (in the background, so a server can answer
"model is loading" meanwhile), applies queued commands (add, abort) between steps, and hands each
step's outputs to the asyncio queue of the request's caller. `generate` is an async iterator of
outputs; leaving it early (client gone, cancellation, timeout) aborts the request, which frees its
KV blocks before the next step. A bounded waiting queue turns overload into `EngineOverloaded`.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llm_engine.config import EngineConfig
from llm_engine.outputs import RequestOutput
from llm_engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # the engine (and torch) is imported by the loop thread, not by importers
    from llm_engine.llm_engine import EngineStats, LLMEngine
    from llm_engine.multimodal.inputs import ImageInputs, ImagePrompt
    from llm_engine.tokenizer import Tokenizer

log = logging.getLogger("codeyard.llm")

ENGINE_THREAD = "llm-engine"  # also the loop thread's name in the OS (top -H, py-spy, the benchmarks' CPU split)


def _name_os_thread(name: str) -> None:
    """Give the calling thread `name` in the OS too (Linux; Python 3.11 names only its own object).
    Threads it starts inherit the name, so torch's worker threads show as the engine's."""
    if sys.platform == "linux":
        with suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME


class EngineNotReady(RuntimeError):
    """The model is still loading, or failed to load (the message says which)."""


class EngineOverloaded(RuntimeError):
    """The waiting queue is full; retry later."""


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int] | ImagePrompt
    params: SamplingParams
    priority: int
    arrival_time: float


@dataclass
class _Abort:
    request_id: str


class _Stream:
    """Outputs of one request, handed from the loop thread to the caller's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        self.finished = False

    def put(self, item: RequestOutput | Exception) -> None:
        """Hand over an item; a caller whose event loop has closed is gone, so it is dropped."""
        with suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


def _put_each(handed: list[tuple[_Stream, RequestOutput]]) -> None:
    for stream, output in handed:
        stream.queue.put_nowait(output)


StepCallback = Callable[["EngineStats", list[RequestOutput]], None]


class AsyncLLMEngine:
    def __init__(self, config: EngineConfig, max_waiting: int = 64,
                 on_step: StepCallback | None = None, cpus: frozenset[int] | None = None) -> None:
        """`cpus`: pin the loop thread (and torch's threads, which it starts) to these CPUs, leaving
        the caller's threads (a server's event loop) where they are."""
        if max_waiting < 0:
            raise ValueError(f"max_waiting: must be >= 0, got {max_waiting!r}")
        self.config = config
        self.max_waiting = max_waiting
        self.on_step = on_step
        self.cpus = cpus
        self.engine: LLMEngine | None = None
        self.load_error: str | None = None
        self.load_progress = 0  # percent, coarse phases of LLMEngine construction
        self._commands: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._pending_adds = 0
        self._stats: EngineStats | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._ready = threading.Event()

    # ----- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start loading the model and then the loop, in a daemon thread; returns at once."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=ENGINE_THREAD, daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort everything and end the loop (a load in progress finishes in the background)."""
        self._stopping = True
        self._commands.put(None)
        if self._thread is not None and self.engine is not None:
            self._thread.join(timeout)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the model is loaded; raises EngineNotReady if loading failed or timed out."""
        if not self._ready.wait(timeout):
            raise EngineNotReady(f"model did not load within {timeout} s")
        if self.load_error:
            raise EngineNotReady(self.load_error)

    @property
    def is_ready(self) -> bool:
        return self.engine is not None

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.require_engine().tokenizer

    @property
    def max_model_len(self) -> int:
        length: int = self.require_engine().max_model_len  # an int the engine computes from the config
        return length

    @property
    def num_kv_blocks(self) -> int | None:
        """The KV cache's size in blocks once the model is loaded (it depends on free memory)."""
        return self.engine.block_manager.num_blocks if self.engine is not None else None

    @property
    def image_inputs(self) -> ImageInputs | None:
        """The model's image preprocessing (None for a text-only model)."""
        return self.require_engine().image_inputs

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        """The prompt's token ids (ValueError for bad input, EngineNotReady while loading)."""
        return self.require_engine().tokenize(prompt)[1]

    def num_waiting(self) -> int:
        """Requests not yet scheduled: waiting in the engine, or queued for the loop to add."""
        return (self._stats.num_waiting if self._stats else 0) + self._pending_adds

    def stats(self) -> EngineStats | None:
        """The snapshot taken after the loop's latest step (None before the model is loaded)."""
        return self._stats

    def require_engine(self) -> LLMEngine:
        if self.engine is None:
            if self.load_error:
                raise EngineNotReady(f"model failed to load: {self.load_error}")
            raise EngineNotReady(f"model is loading ({self.load_progress}%), retry shortly")
        return self.engine

    # ----- requests ---------------------------------------------------------------------------

    async def generate(self, prompt: str | list[int] | ImagePrompt, sampling_params: SamplingParams,
                       request_id: str, priority: int = 0) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's output after each step that changed it (cumulative text/tokens).

        Raises EngineNotReady, EngineOverloaded, ValueError (bad prompt/parameters, naming the
        field). Closing the iterator before the final output aborts the request.
        """
        self.require_engine()
        stream = _Stream(asyncio.get_running_loop())
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"request_id: {request_id!r} is already in use")
            waiting = self.num_waiting()
            if waiting >= self.max_waiting:
                raise EngineOverloaded(f"the server is busy: {waiting} requests are waiting "
                                       f"(limit {self.max_waiting}); retry later")
            self._streams[request_id] = stream
            self._pending_adds += 1
        self._commands.put(_Add(request_id, prompt, sampling_params, priority, time.time()))
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, Exception):
                    stream.finished = True
                    raise item
                if item.finished:
                    stream.finished = True
                yield item
                if item.finished:
                    return
        finally:
            if not stream.finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op when unknown or finished); its blocks are freed before the next step."""
        self._commands.put(_Abort(request_id))

    # ----- the loop thread ----------------------------------------------------------------------

    def _main(self) -> None:
        _name_os_thread(ENGINE_THREAD)
        try:
            engine = self._load()
        except Exception as exc:  # reported to every caller as EngineNotReady
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("LLM model %s failed to load: %s", self.config.model, self.load_error)
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop()
        finally:
            self._fail_all(EngineNotReady("the engine stopped"))
            engine.shutdown()  # tensor-parallel workers end with the loop

    def _load(self) -> LLMEngine:
        started = time.monotonic()
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)  # pid 0: this thread alone (Linux), before torch starts threads
        log.info("LLM: loading %s: 0%%", self.config.model)
        from llm_engine.llm_engine import LLMEngine

        self.load_progress = 10
        engine = LLMEngine(self.config)
        self.load_progress = 100
        self._stats = engine.get_stats()
        self.engine = engine
        log.info("LLM: loading %s: 100%% (%.1f s, %d KV blocks of %d tokens)", self.config.model,
                 time.monotonic() - started, engine.block_manager.num_blocks, self.config.block_size)
        return engine

    def _loop(self) -> None:
        engine = self.engine
        assert engine is not None
        while not self._stopping:
            block = not engine.has_unfinished_requests()
            if not self._apply_commands(engine, block):
                return
            if not engine.has_unfinished_requests():
                if engine.release_kv_holds():  # a prefill instance's transfers end while it idles
                    self._report(engine, [])
                continue
            try:
                outputs = engine.step()
            except Exception as exc:  # keep serving: fail the requests in flight, not the server
                log.exception("LLM engine step failed")
                engine.abort_request(list(engine.requests))
                engine.step()
                self._fail_all(RuntimeError(f"engine step failed: {type(exc).__name__}: {exc}"))
                continue
            self._report(engine, outputs)

    def _report(self, engine: LLMEngine, outputs: list[RequestOutput]) -> None:
        """After a step: the stats snapshot, the outputs to their callers, the step callback."""
        self._stats = engine.get_stats()
        self._deliver(outputs)
        if self.on_step is not None:
            self.on_step(self._stats, outputs)

    def _apply_commands(self, engine: LLMEngine, block: bool) -> bool:
        """Apply every queued command (waiting for one when idle); False when asked to stop."""
        while True:
            try:
                command = self._commands.get(block=block, timeout=1.0 if block else None)
            except queue.Empty:
                return not block or not self._stopping
            block = False
            if command is None:
                return False
            if isinstance(command, _Abort):
                engine.abort_request(command.request_id)
                continue
            with self._lock:
                self._pending_adds -= 1
            try:
                engine.add_request(command.request_id, command.prompt, command.params,
                                   priority=command.priority, arrival_time=command.arrival_time)
            except ValueError as exc:
                self._fail(command.request_id, exc)
            else:
                self._stats = engine.get_stats()

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's outputs over with one wake-up per event loop, not one per request: each
        wake-up is a write to the loop's self-pipe and a GIL hand-off, and a step may feed dozens."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, RequestOutput]]] = {}
        with self._lock:
            for output in outputs:
                stream = self._streams.get(output.request_id)
                if output.finished:
                    self._streams.pop(output.request_id, None)
                if stream is not None:
                    by_loop.setdefault(stream.loop, []).append((stream, output))
        for loop, handed in by_loop.items():
            with suppress(RuntimeError):  # that caller's event loop has closed: it is gone
                loop.call_soon_threadsafe(_put_each, handed)

    def _fail(self, request_id: str, exc: Exception) -> None:
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put(exc)

    def _fail_all(self, exc: Exception) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.put(exc)
