"""EngineCoreClient: `AsyncLLMEngine`'s interface over the engine core in its own process (vLLM V1's
`AsyncLLM` + `EngineCoreClient`). The servers' API process keeps the HTTP/gRPC event loop,
tokenizing and streaming; the core (`llm_engine.engine_core`) steps without sharing a GIL with them.

The core's messages are read off the socket by the server's event loop itself when `start` is
given it (`loop.add_reader`: a step's outputs reach their requests with no thread between), else
by a reader thread that hands outputs to the callers' event loops as the in-thread engine does. When the core dies (killed, out of memory), the requests in
flight fail at once with EngineNotReady naming its exit status, and later ones get the same (503).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from llm_engine.config import EngineConfig
from llm_engine.engine_core import CoreFailed, CoreHello, CoreLoadFailed, CoreMessage, CoreReady, CoreStep
from llm_engine.engine_loop import Command
from llm_engine.output_deltas import DeltaDecoder
from llm_engine.request_streams import EngineNotReady, RequestStreams, StepCallback
from llm_engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from llm_engine.multimodal.inputs import ImageInputs

log = logging.getLogger("codeyard.llm")


class EngineCoreClient(RequestStreams):
    def __init__(self, config: EngineConfig, max_waiting: int = 64,
                 on_step: StepCallback | None = None, cpus: frozenset[int] | None = None) -> None:
        """`cpus`: the core process runs on these CPUs (torch's threads too); this process stays put."""
        super().__init__(max_waiting, on_step)
        self.config = config
        self.cpus = cpus
        self.load_error: str | None = None
        self.load_progress = 0  # percent: 0 while the core loads, 100 once it has
        self.core: subprocess.Popen[bytes] | None = None
        self._info: CoreReady | None = None
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._ready = threading.Event()
        self._stopping = False
        self._decoder = DeltaDecoder()  # read by one reader at a time (the thread or the loop)

    # ----- lifecycle ------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the core process (it loads the model) and what reads it; returns at once.
        `loop`: that event loop reads the core's socket (no blocking `wait_ready` on it, then);
        None: a thread of its own does. Why the loop: in a burst the step's report went core ->
        reader thread -> the loop (a wake-up and a GIL hand-off each) before any first token left."""
        if self.core is not None:
            return
        ours, theirs = socket.socketpair()
        self.core = subprocess.Popen([sys.executable, "-m", "llm_engine.engine_core", str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),))
        theirs.close()
        self._conn = Connection(ours.detach())
        self._send(CoreHello(self.config, self.cpus))
        if loop is None:
            threading.Thread(target=self._read, name="engine-core-reader", daemon=True).start()
        else:
            loop.add_reader(self._conn.fileno(), self._read_ready, loop)
            # uvloop (libuv) makes a watched descriptor non-blocking: a message read in part, or a
            # command sent while the core's side is full, would fail. Readiness needs no such mode.
            os.set_blocking(self._conn.fileno(), True)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the core to stop, then end it if it has not within `timeout`."""
        self._stopping = True
        if self.core is None:
            return
        try:
            self._send(None)
            self.core.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.core.kill()
            self.core.wait()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the model is loaded; raises EngineNotReady if loading failed or timed out."""
        if not self._ready.wait(timeout):
            raise EngineNotReady(f"model did not load within {timeout} s")
        self.require_engine()

    # ----- what the API side knows of the model ---------------------------------------------------

    @property
    def is_ready(self) -> bool:
        return self._info is not None and self.load_error is None

    def require_engine(self) -> CoreReady:
        """What the core said of its model once loaded (EngineNotReady while loading, failed or dead)."""
        if self.load_error:
            raise EngineNotReady(self.load_error)
        if self._info is None:
            raise EngineNotReady("model is loading, retry shortly")
        return self._info

    def check_ready(self) -> None:
        self.require_engine()

    @property
    def tokenizer(self) -> Tokenizer | None:
        tokenizer: Tokenizer | None = self.require_engine().tokenizer
        return tokenizer

    @property
    def max_model_len(self) -> int:
        return self.require_engine().max_model_len

    @property
    def num_kv_blocks(self) -> int | None:
        return self._info.num_kv_blocks if self._info is not None else None

    @property
    def image_inputs(self) -> ImageInputs | None:
        inputs: ImageInputs | None = self.require_engine().image_inputs
        return inputs

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        """The prompt's token ids, here rather than in the core (ValueError for bad input)."""
        return self.require_engine().tokenize(prompt)[1]

    # ----- the socket ---------------------------------------------------------------------------

    def _submit(self, command: Command) -> None:
        try:
            self._send(command)
        except OSError:  # the core is gone: the reader fails the request with the reason
            pass

    def _send(self, message: CoreHello | Command | None) -> None:
        assert self._conn is not None
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self._conn.send_bytes(data)

    def _read(self) -> None:
        """The reader thread: every message until the socket ends, then the core's end."""
        broken: str | None = None
        while broken is None:
            broken = self._read_one()
        self._ended(broken)

    def _read_ready(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the event loop, when the socket is readable: one message (one being written is read to
        its end: the core writes each at once, so that waits only while it does); once the socket
        ends, the core's end in a thread (it waits for the process). A further message waiting is
        read on the loop's next pass (readiness is level-triggered), not looked for here: that look
        (`Connection.poll`, a selector built per call) ran after every report, on the first token's
        way to its client, and found nothing nearly always (a step's report is one message)."""
        assert self._conn is not None
        broken = self._read_one()
        if broken is not None:
            loop.remove_reader(self._conn.fileno())
            threading.Thread(target=self._ended, args=(broken,), name="engine-core-end", daemon=True).start()

    def _read_one(self) -> str | None:
        """Read and handle one message; None, or once the socket has ended, why ("" for no reason
        but the core's exit)."""
        assert self._conn is not None and self.core is not None
        try:
            message: CoreMessage = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            return ""
        except Exception as exc:  # a message this side cannot read: the two sides disagree
            log.exception("LLM: unreadable message from the engine core")
            self.core.kill()
            return f"; unreadable message: {type(exc).__name__}: {exc}"
        self._handle(message)
        return None

    def _ended(self, broken: str) -> None:
        assert self.core is not None
        code = self.core.wait()
        reason = (f"signal {-code}" if code < 0 else f"code {code}") + broken
        if self.load_error is None:
            self.load_error = ("the engine stopped" if self._stopping else
                               f"the engine core process exited ({reason}); restart the server")
            if not self._stopping:
                log.error("LLM: %s", self.load_error)
        self._ready.set()
        self._decoder.forget(None)
        self.fail_all(EngineNotReady(self.load_error))

    def _handle(self, message: CoreMessage) -> None:
        if isinstance(message, CoreStep):
            with self._lock:
                self._pending_adds -= message.adds
            self.report_step(message.stats, self._decoder.decode(message.outputs))
        elif isinstance(message, CoreFailed):
            with self._lock:
                self._pending_adds -= message.request_id is not None
            self._decoder.forget(message.request_id)
            if message.request_id is None:
                self.fail_all(message.error)
            else:
                self.fail(message.request_id, message.error)
        elif isinstance(message, CoreReady):
            self._stats, self._info, self.load_progress = message.stats, message, 100
            self._ready.set()
        elif isinstance(message, CoreLoadFailed):
            self.load_error = f"model failed to load: {message.error}"
            log.error("LLM model %s failed to load: %s", self.config.model, message.error)
            self._ready.set()

