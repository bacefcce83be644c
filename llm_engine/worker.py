"""One tensor-parallel rank: it joins the gloo group, builds its shard of the model and KV pool,
then runs each step the engine sends until told to stop.

`RankWorker` is the rank itself, whichever way it was started: here in a local process, or as a
Ray actor (llm_engine/ray_executor.py). A local rank is started as `python -m llm_engine.worker`
(not multiprocessing's spawn, which runs the caller's main script again in the child); it
connects back to the engine's address from CODEYARD_TP_ENGINE (host:port) with the key in
CODEYARD_TP_AUTHKEY, then receives (rank, world size, init method, EngineConfig). Messages from
the engine: a `StepInput`, or None to stop. Replies: ("ready", (num_blocks, KV pool file or None))
once loaded, ("ok", result) per step (the logits from rank 0, None from the others, whose copies
are the same after the all-gather), or ("error", type name, message), after which the worker exits.
"""

from __future__ import annotations

import os
import pickle
from multiprocessing.connection import Client, Connection
from typing import cast

import torch
import torch.distributed as dist

from llm_engine.config import EngineConfig
from llm_engine.distributed import init_tp_group
from llm_engine.kv_connector import KVShardFile
from llm_engine.loader import ModelSource
from llm_engine.model_runner import ModelRunner, StepInput

StepResult = tuple[torch.Tensor, list[tuple[int, int, torch.Tensor]]] | None  # rank 0's (logits, prompt logits)


class RankWorker:
    """One rank's shard of the model and of the KV pool, in the group it joined on creation."""

    def __init__(self, rank: int, world_size: int, init_method: str, config: EngineConfig) -> None:
        torch.set_num_threads(config.num_threads or max(1, (os.cpu_count() or 1) // world_size))
        init_tp_group(rank, world_size, init_method)
        source = ModelSource(config.model, config.tokenizer)
        self.rank = rank
        hf_config = source.hf_config()
        self.runner = ModelRunner(config, hf_config, source)
        self.num_blocks = self.runner.num_blocks
        self.kv_shard: KVShardFile | None = None  # disaggregated serving: the engine maps the pool's file to move its KV
        if self.runner.kv_pool_path is not None:
            text = hf_config.get_text_config()
            self.kv_shard = KVShardFile.of_rank(self.runner.kv_cache, self.runner.kv_pool_path, rank, world_size,
                                                getattr(text, "num_key_value_heads", None) or text.num_attention_heads)

    def ready(self) -> tuple[int, KVShardFile | None]:
        """What the executor needs once this rank has loaded: its pool's size and file."""
        return self.num_blocks, self.kv_shard

    def step(self, step: StepInput) -> StepResult:
        logits, prompt_logits = self.runner.run_step(step)
        return (logits, prompt_logits) if self.rank == 0 else None

    def close(self) -> None:
        dist.destroy_process_group()


def main() -> None:
    host, port = os.environ.pop("CODEYARD_TP_ENGINE").rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ.pop("CODEYARD_TP_AUTHKEY")))
    hello = cast(tuple[int, int, str, EngineConfig], receive(conn))  # the engine's first message
    rank, world_size, init_method, config = hello
    run_worker(rank, world_size, init_method, config, conn)


def run_worker(rank: int, world_size: int, init_method: str, config: EngineConfig, conn: Connection) -> None:
    try:
        worker = RankWorker(rank, world_size, init_method, config)
        send(conn, ("ready", worker.ready()))
        while (step := _next_step(conn)) is not None:
            send(conn, ("ok", worker.step(step)))
        worker.close()
    except Exception as exc:  # reported to the engine, which tears the group down
        send(conn, ("error", type(exc).__name__, str(exc)))


def send(conn: Connection, message: object) -> None:
    """Plain pickle: Connection.send would pass tensors as shared-memory handles that only
    processes of one multiprocessing family can open."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> object:
    return pickle.loads(conn.recv_bytes())


def _next_step(conn: Connection) -> StepInput | None:
    """The next message; the engine's end closing (its process died) reads as stop."""
    try:
        return cast(StepInput | None, receive(conn))
    except EOFError:
        return None


if __name__ == "__main__":
    main()
