"""Tensor parallelism: the engine keeps the scheduler and the sampler and sends each step to one
worker per rank (llm_engine/worker.py); the ranks run the model together over a gloo group and
rank 0 sends the logits back. `MultiprocExecutor` runs the ranks as local processes (the
default); `RayExecutor` (llm_engine/ray_executor.py) places them on a Ray cluster.

The engine process itself never joins the group, so several engines (of any parallel size) can
live in one process. A worker that dies or fails takes the whole group with it: every rank holds
a share of every KV block, so the executor kills the rest and raises `WorkerGroupError`; the
engine fails the requests whose KV lived there and calls `restart`.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener, wait
from typing import Any, NoReturn, cast

import torch

from llm_engine.config import EngineConfig
from llm_engine.kv_connector import KVShardFile
from llm_engine.model_runner import StepInput, prepare_step
from llm_engine.sampler import Sampler, SampleResult
from llm_engine.sequence import Sequence
from llm_engine.worker import StepResult, receive, send

STARTUP_TIMEOUT_S = 300  # loading a model's shard, on a machine other work keeps busy


class WorkerGroupError(RuntimeError):
    """A tensor-parallel worker died or failed; the group and its KV cache are gone."""


@dataclass
class _Worker:
    rank: int
    process: subprocess.Popen[bytes]
    conn: Connection


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _stop_workers(workers: list[_Worker], graceful: bool) -> None:
    """Stop every worker (asking first when graceful) and reap it; the list is emptied."""
    for worker in workers:
        if graceful and worker.process.poll() is None:
            try:
                send(worker.conn, None)
            except OSError:
                pass
    for worker in workers:
        try:
            worker.process.wait(timeout=5 if graceful else 0)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()
        worker.conn.close()
    workers.clear()


class WorkerGroupExecutor(ABC):
    """Stands where the ModelRunner stands for tensor_parallel_size > 1 (same execute/sample);
    a subclass starts, drives and stops the ranks wherever they run."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.sampler = Sampler(config.seed)
        self.num_blocks = self._start()

    @property
    @abstractmethod
    def pids(self) -> list[int]:
        """The ranks' process ids (on their own machines, for a Ray cluster)."""

    @abstractmethod
    def _start(self) -> int:
        """Start every rank and wait until all have loaded; returns the KV pool size."""

    @abstractmethod
    def _run(self, step: StepInput) -> StepResult:
        """Run one step on every rank; rank 0's result. A lost rank raises WorkerGroupError."""

    @abstractmethod
    def _stop(self, graceful: bool) -> None:
        """Stop every rank (asking first when graceful)."""

    def _pool_size(self, load: Callable[[], list[Any]]) -> int:
        """The KV pool size every rank reports once loaded (`load` waits for their replies), and where
        their pools live when in files (`kv_shards`); a rank's ValueError (a bad configuration) is
        raised as it is with one rank."""
        try:
            replies = load()  # each rank's `RankWorker.ready()`
        except WorkerGroupError as exc:
            if isinstance(exc.__cause__, ValueError):
                raise exc.__cause__ from None
            raise
        sizes = [size for size, _ in replies]
        if len(set(sizes)) != 1:
            self._stop(graceful=False)
            raise WorkerGroupError(f"ranks disagree on the KV pool size: {sizes}")
        self.kv_shards: list[KVShardFile] = [shard for _, shard in replies if shard is not None]
        num_blocks: int = sizes[0]
        return num_blocks

    def execute(self, scheduled: list[tuple[Sequence, int]], block_copies: list[tuple[int, int]]
                ) -> tuple[torch.Tensor, list[tuple[Sequence, int, torch.Tensor]]]:
        result = self._run(prepare_step(scheduled, block_copies))
        assert result is not None  # rank 0 returns the logits
        logits, prompt_logits = result
        return logits, [(scheduled[index][0], start, chunk) for index, start, chunk in prompt_logits]

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: set[int]) -> list[SampleResult]:
        return self.sampler(logits, seqs, eos_token_ids)

    def restart(self) -> None:
        """A fresh group (weights loaded again, empty KV pool) after a failure."""
        self._stop(graceful=False)
        if self._start() != self.num_blocks:
            self._stop(graceful=False)
            raise WorkerGroupError("the restarted group has a different KV pool size")

    def shutdown(self) -> None:
        self._stop(graceful=True)


class MultiprocExecutor(WorkerGroupExecutor):
    """The ranks as local processes, connected back to the engine over an authenticated socket."""

    def __init__(self, config: EngineConfig) -> None:
        self.workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _stop_workers, self.workers, False)
        super().__init__(config)

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]

    def _start(self) -> int:
        """Start one process per rank and wait until all have loaded; returns the pool size."""
        world_size = self.config.tensor_parallel_size
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        authkey = secrets.token_bytes(32)
        with Listener(("127.0.0.1", 0), authkey=authkey) as listener:
            env = dict(os.environ, CODEYARD_TP_ENGINE=f"127.0.0.1:{listener.address[1]}",
                       CODEYARD_TP_AUTHKEY=authkey.hex())
            processes = [subprocess.Popen([sys.executable, "-m", "llm_engine.worker"], env=env)
                         for _ in range(world_size)]
            # Listener has no public accept timeout: set it on its socket
            listener._listener._socket.settimeout(STARTUP_TIMEOUT_S)  # type: ignore[attr-defined]
            for rank, process in enumerate(processes):
                try:
                    conn = listener.accept()
                except OSError as exc:
                    for p in processes:
                        p.kill()
                        p.wait()
                    raise WorkerGroupError(f"tensor-parallel workers did not connect: {exc}") from exc
                send(conn, (rank, world_size, init_method, self.config))
                self.workers.append(_Worker(rank, process, conn))
        return self._pool_size(lambda: self._gather("ready"))

    def _gather(self, expected: str) -> list[Any]:
        """Each rank's reply to the last message; a rank that died or failed fails the group."""
        replies: dict[int, object] = {}
        pending = {w.conn: w for w in self.workers}
        while pending:
            for conn in cast(list[Connection], wait(list(pending))):  # waits on the workers' connections only
                worker = pending.pop(conn)
                try:
                    kind, *payload = cast(tuple[Any, ...], receive(conn))  # (kind, *payload), see worker.py
                except (EOFError, OSError):
                    self._fail(self._death() or f"tensor-parallel rank {worker.rank} closed its connection")
                if kind != expected:
                    name, message = payload
                    cause = ValueError(message) if name == "ValueError" else None
                    self._fail(self._death() or f"tensor-parallel rank {worker.rank} failed: {name}: {message}",
                               cause)
                replies[worker.rank] = payload[0]
        return [replies[rank] for rank in range(len(self.workers))]

    def _death(self, grace_s: float = 2.0) -> str | None:
        """Which rank died, when one did: the others then fail in their collectives, and may
        report that first. A rank killed by a signal is the likeliest first cause."""
        deadline = time.monotonic() + grace_s
        while True:
            ended = [w for w in self.workers if w.process.poll() not in (None, 0)]  # 0: after reporting
            if ended or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if not ended:
            return None
        first = min(ended, key=lambda w: (w.process.returncode >= 0, w.rank))
        code = first.process.returncode
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        return f"tensor-parallel rank {first.rank} (pid {first.process.pid}) died ({how})"

    def _fail(self, message: str, cause: Exception | None = None) -> NoReturn:
        _stop_workers(self.workers, graceful=False)
        raise WorkerGroupError(message) from cause

    def _run(self, step: StepInput) -> StepResult:
        if not self.workers:
            raise WorkerGroupError("the tensor-parallel workers are stopped")
        for worker in self.workers:
            try:
                send(worker.conn, step)
            except OSError:
                self._fail(f"tensor-parallel rank {worker.rank} is gone")
        result: StepResult = self._gather("ok")[0]
        return result

    def _stop(self, graceful: bool) -> None:
        _stop_workers(self.workers, graceful)
