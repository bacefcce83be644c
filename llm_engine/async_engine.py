"""AsyncLLMEngine: the engine loop in its own thread, driven by asyncio callers.

The loop thread owns the LLMEngine: it loads the model (in the background, so a server can answer
"model is loading" meanwhile), applies queued commands (add, abort) between steps, and hands each
step's outputs to the asyncio queue of the request's caller. `generate` is an async iterator of
outputs; leaving it early (client gone, cancellation, timeout) aborts the request, which frees its
KV blocks before the next step. A bounded waiting queue turns overload into `EngineOverloaded`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import sys
import threading
import time
from contextlib import suppress
from typing import TYPE_CHECKING

from llm_engine.config import EngineConfig
from llm_engine.engine_loop import NO_COMMAND, AddRequest, Command, run_loop
from llm_engine.outputs import RequestOutput
from llm_engine.request_streams import EngineNotReady as EngineNotReady
from llm_engine.request_streams import EngineOverloaded as EngineOverloaded
from llm_engine.request_streams import RequestStreams, StepCallback

if TYPE_CHECKING:  # the engine (and torch) is imported by the loop thread, not by importers
    from llm_engine.engine_loop import NoCommand
    from llm_engine.llm_engine import LLMEngine
    from llm_engine.multimodal.inputs import ImageInputs
    from llm_engine.tokenizer import Tokenizer

log = logging.getLogger("codeyard.llm")

ENGINE_THREAD = "llm-engine"  # also the loop thread's name in the OS (top -H, py-spy, the benchmarks' CPU split)


def name_os_thread(name: str) -> None:
    """Give the calling thread `name` in the OS too (Linux; Python 3.11 names only its own object).
    Threads it starts inherit the name, so torch's worker threads show as the engine's."""
    if sys.platform == "linux":
        with suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME


class AsyncLLMEngine(RequestStreams):
    def __init__(self, config: EngineConfig, max_waiting: int = 64,
                 on_step: StepCallback | None = None, cpus: frozenset[int] | None = None) -> None:
        """`cpus`: pin the loop thread (and torch's threads, which it starts) to these CPUs, leaving
        the caller's threads (a server's event loop) where they are."""
        super().__init__(max_waiting, on_step)
        self.config = config
        self.cpus = cpus
        self.engine: LLMEngine | None = None
        self.load_error: str | None = None
        self.load_progress = 0  # percent, coarse phases of LLMEngine construction
        self._commands: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
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

    def require_engine(self) -> LLMEngine:
        if self.engine is None:
            if self.load_error:
                raise EngineNotReady(f"model failed to load: {self.load_error}")
            raise EngineNotReady(f"model is loading ({self.load_progress}%), retry shortly")
        return self.engine

    def check_ready(self) -> None:
        self.require_engine()

    def _submit(self, command: Command) -> None:
        self._commands.put(command)

    # ----- the loop thread ----------------------------------------------------------------------

    def _main(self) -> None:
        name_os_thread(ENGINE_THREAD)
        try:
            engine = self._load()
        except Exception as exc:  # reported to every caller as EngineNotReady
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("LLM model %s failed to load: %s", self.config.model, self.load_error)
            self._ready.set()
            return
        self._ready.set()
        try:
            run_loop(engine, self)
        finally:
            self.fail_all(EngineNotReady("the engine stopped"))
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

    # ----- LoopHost: the shared loop's commands and results -----------------------------------------

    def next_command(self, wait: float) -> Command | NoCommand | None:
        if self._stopping:
            return None
        try:
            command = self._commands.get(block=wait > 0, timeout=wait or None)
        except queue.Empty:
            return None if self._stopping else NO_COMMAND
        if isinstance(command, AddRequest):
            with self._lock:
                self._pending_adds -= 1
        return command

    def added(self, engine: LLMEngine) -> None:
        self._stats = engine.get_stats()

    def idle(self, engine: LLMEngine) -> None:
        self._stats = engine.get_stats()

    def report(self, engine: LLMEngine, outputs: list[RequestOutput]) -> None:
        self.report_step(engine.get_stats(), outputs)
