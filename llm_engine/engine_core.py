"""The engine core in its own process (`python -m llm_engine.engine_core FD`), vLLM V1's EngineCore.

A server's event loop and the engine's step loop shared one interpreter, so every step waited for
the GIL while the loop parsed, streamed and detokenized on the other core (server TPOT ~60 ms against
offline's 46 with the same engine CPU per token). Here the step loop has an interpreter to itself:
requests come in over a socket (pickled `AddRequest`/`AbortRequest`, None to stop), and every step's
outputs, the stats snapshot and failures go back on it (`CoreMessage`s). `EngineCoreClient` is the
other end. The core ends with its socket: when the server process goes, so does the core.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import select
import signal
import socket
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from llm_engine.async_engine import ENGINE_THREAD, name_os_thread
from llm_engine.config import EngineConfig
from llm_engine.engine_loop import NO_COMMAND, Command, NoCommand, run_loop
from llm_engine.output_deltas import DeltaEncoder, StepItem
from llm_engine.outputs import RequestOutput
from llm_engine.tokenizer import tokenize_prompt

if TYPE_CHECKING:
    from llm_engine.llm_engine import EngineStats, LLMEngine

log = logging.getLogger("codeyard.llm")


@dataclass
class CoreHello:
    """The first message to the core: what to load and where to run."""

    config: EngineConfig
    cpus: frozenset[int] | None


@dataclass
class CoreReady:
    """The model loaded: what the API process needs to tokenize, check lengths and describe the model."""

    max_model_len: int
    num_kv_blocks: int
    eos_token_ids: set[int]
    vocab_size: int
    tokenizer: Any  # the engine's Hugging Face tokenizer, pickled (None for a model without one)
    image_inputs: Any  # the model's ImageInputs, pickled (None for a text-only model)
    stats: EngineStats

    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        """As `LLMEngine.tokenize`, in the API process."""
        return tokenize_prompt(self.tokenizer, self.vocab_size, prompt)


@dataclass
class CoreLoadFailed:
    error: str


@dataclass
class CoreStep:
    """A step's outputs (what changed per request: `output_deltas`) and the stats after it."""

    outputs: list[StepItem]
    # EngineStats' fields in order (`of`, `stats`): plain values pickle and unpickle cheaper than the
    # dataclass, and every step sends them (on a first token's way, with caches cold after a prefill)
    stats_values: tuple[Any, ...]
    adds: int  # requests added to the engine since the last message

    @classmethod
    def of(cls, outputs: list[StepItem], stats: EngineStats, adds: int) -> CoreStep:
        return cls(outputs, tuple(vars(stats).values()), adds)  # a dataclass's __dict__ is in field order

    @property
    def stats(self) -> EngineStats:
        from llm_engine.llm_engine import EngineStats

        return EngineStats(*self.stats_values)


@dataclass
class CoreFailed:
    """A request was refused (`request_id`), or every request in flight failed (None)."""

    request_id: str | None
    error: Exception


CoreMessage = CoreReady | CoreLoadFailed | CoreStep | CoreFailed


class EngineCore:
    """The loop's host in the core process: commands from the socket, results back on it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.adds = 0
        self.encoder = DeltaEncoder()
        # One poll object for the socket: `Connection.poll` builds a selector, registers the socket
        # and drops it again on every call, once a step at least (~3 us against ~0.3; py-spy had it
        # at ~0.7% of a busy core's samples).
        self._poller = select.poll()
        self._poller.register(conn.fileno(), select.POLLIN)

    def send(self, message: CoreMessage) -> None:
        self.conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def next_command(self, wait: float) -> Command | NoCommand | None:
        try:
            if not self._poller.poll(math.ceil(wait * 1000)):  # readable, or the other side closed
                return NO_COMMAND
            command: Command | None = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):  # the server process is gone
            return None
        return command

    def added(self, engine: LLMEngine) -> None:
        self.adds += 1

    def report(self, engine: LLMEngine, outputs: list[RequestOutput]) -> None:
        self.send(CoreStep.of(self.encoder.encode(outputs), engine.get_stats(), self.adds))
        self.adds = 0

    def idle(self, engine: LLMEngine) -> None:
        # no step ran: nothing for the step-size histogram (the stats repeat the last step's size)
        self.send(CoreStep.of([], replace(engine.get_stats(), last_iteration_tokens=0), self.adds))
        self.adds = 0

    def fail(self, request_id: str, exc: Exception) -> None:
        self.send(CoreFailed(request_id, exc))

    def fail_all(self, exc: Exception) -> None:
        self.encoder.clear()
        self.send(CoreFailed(None, exc))


def _load(conn: Connection) -> LLMEngine | None:
    hello: CoreHello = pickle.loads(conn.recv_bytes())
    if hello.cpus:
        os.sched_setaffinity(0, hello.cpus)  # before torch starts its threads, which inherit it
    started = time.monotonic()
    log.info("LLM engine core: loading %s: 0%%", hello.config.model)
    try:
        from llm_engine.llm_engine import LLMEngine

        engine = LLMEngine(hello.config)
    except Exception as exc:  # the server answers 503 with this
        conn.send_bytes(pickle.dumps(CoreLoadFailed(f"{type(exc).__name__}: {exc}")))
        return None
    log.info("LLM engine core: loading %s: 100%% (%.1f s, %d KV blocks of %d tokens)", hello.config.model,
             time.monotonic() - started, engine.block_manager.num_blocks, hello.config.block_size)
    conn.send_bytes(pickle.dumps(CoreReady(engine.max_model_len, engine.block_manager.num_blocks,
                                           engine.eos_token_ids, engine.vocab_size, engine.tokenizer,
                                           engine.image_inputs, engine.get_stats())))
    return engine


def main(argv: list[str]) -> None:
    """Serve the engine over the inherited socket `argv[0]` (a file descriptor) until it closes."""
    name_os_thread(ENGINE_THREAD)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server stops us
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    conn = Connection(socket.socket(fileno=int(argv[0])).detach())
    engine = _load(conn)
    if engine is None:
        return
    try:
        run_loop(engine, EngineCore(conn))
    finally:
        with suppress(Exception):
            engine.shutdown()


if __name__ == "__main__":
    # Run the imported module's main, not this `__main__` copy's: the messages must pickle as
    # llm_engine.engine_core's classes for the API process to read them.
    from llm_engine.engine_core import main as module_main

    module_main(sys.argv[1:])
