"""Moving a request's KV blocks from a prefill instance's pool into a decode instance's pool.

The shape of vLLM's KV connector and TensorRT-LLM's cache transceiver, for disaggregated serving.
The prefill instance (the producer) computes a prompt and `send` keeps the request's filled blocks,
returning the `kv_transfer_params` the proxy hands to the decode instance. The decode instance (the
consumer) gives the prompt blocks, keeps those its own prefix cache already holds, and `receive`
pulls the rest. The consumer pulls because only it knows which blocks it has.

- Control: one TCP connection per transfer to the producer's KV port. The consumer sends a JSON
  line (shared key, transfer id, first block, count, transport) and the producer answers with one.
- "shm" (one host): the producer's pool lives in a file under /dev/shm (mode 0600). The answer names
  the file and the block ids, the consumer copies those blocks out of its own mapping of the file,
  then says it is done.
- "socket" (between hosts): the blocks' bytes follow the answer.

Tensor-parallel instances: each rank holds the pool's KV heads for its query heads (`KVShard`), in a
file the engine process maps (`KVShardFile`), so the engine's connector reads and writes every
rank's blocks. Transfers name heads, not ranks: a shm answer names each distinct shard's file and
first head, the socket transport sends every head of a block in one tensor, and the consumer copies
the heads each of its shards holds. So a prefill instance at TP=2 hands its KV to a decode instance
at TP=1 (or any other split of the same model), and ranks that keep copies of one KV head (fewer KV
heads than ranks) each get it.

The producer lets go of a transfer's blocks when its connection ends (done, an error or a dead
consumer) or when nobody asked for them within `hold_timeout_s`. The engine frees them on its own
thread (`take_released`), because the block manager is not shared between threads. Held blocks are
never written: the engine only writes blocks it has just handed out.

A consumer pulls on a thread of its own (`start_load`, then `finished_loads`), as vLLM's async KV
loads do: a pull waits for the producer's answer, and the producer is busy computing long
prompts, so a pull on the engine's thread stalled every running request's next token for that
long. The socket waits and the tensor copies release the GIL, so the engine keeps stepping.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import queue
import secrets
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from io import BufferedIOBase
from pathlib import Path
from typing import Any

import torch

from llm_engine.kv_pool_files import new_pool_file, remove_pool

ROLES = ("kv_producer", "kv_consumer")
TRANSPORTS = ("shm", "socket")
CONNECT_TIMEOUT_S = 5.0
TRANSFER_TIMEOUT_S = 60.0
CLOSE_JOIN_S = 10.0  # how long close() waits for the connector's thread (a pull under way) to end


class KVTransferError(RuntimeError):
    """A transfer that could not be done (the decode side then computes the prompt itself)."""


@dataclass
class KVTransferConfig:
    """vLLM's `kv_transfer_config` fields that apply here. For a producer, `kv_ip`/`kv_port` are the
    address its KV port listens on (port 0: any free one). For a consumer, they are the producer's
    address. `kv_key` is the shared secret of the KV port (None: none)."""

    kv_role: str
    kv_ip: str = "127.0.0.1"
    kv_port: int = 0
    kv_transport: str = "shm"
    kv_key: str | None = None
    hold_timeout_s: float = 30.0

    @classmethod
    def from_dict(cls, value: dict[str, Any] | KVTransferConfig) -> KVTransferConfig:
        if isinstance(value, KVTransferConfig):
            config = value
        elif isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValueError(f"kv_transfer_config: unknown keys {unknown}")
            if "kv_role" not in value:
                raise ValueError("kv_transfer_config: kv_role is required (kv_producer or kv_consumer)")
            config = cls(**value)
        else:
            raise ValueError(f"kv_transfer_config: expected a dict, got {value!r}")
        if config.kv_role not in ROLES:
            raise ValueError(f"kv_transfer_config: kv_role must be one of {ROLES}, got {config.kv_role!r}")
        if config.kv_transport not in TRANSPORTS:
            raise ValueError(f"kv_transfer_config: kv_transport must be one of {TRANSPORTS}, "
                             f"got {config.kv_transport!r}")
        if not isinstance(config.kv_port, int) or not 0 <= config.kv_port <= 65535:
            raise ValueError(f"kv_transfer_config: kv_port must be a port number, got {config.kv_port!r}")
        if config.kv_role == "kv_consumer" and config.kv_port == 0:
            raise ValueError("kv_transfer_config: a kv_consumer needs the producer's kv_port")
        if config.hold_timeout_s <= 0:
            raise ValueError(f"kv_transfer_config: hold_timeout_s must be positive, got {config.hold_timeout_s!r}")
        return config

    @property
    def is_producer(self) -> bool:
        return self.kv_role == "kv_producer"


def shared_kv_pool(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, Path]:
    """A zeroed pool in a new file that only this user can map (under /dev/shm where it exists),
    removed by `KVConnector.close`, at exit, or by the next sweep if this process is killed."""
    path = new_pool_file()
    return map_pool(str(path), shape, dtype), path


def map_pool(path: str, shape: tuple[int, ...] | list[int], dtype: torch.dtype) -> torch.Tensor:
    """A pool file mapped shared: writes go to the one copy every process mapping it sees."""
    return torch.from_file(path, shared=True, size=math.prod(shape), dtype=dtype).view(tuple(shape))


@dataclass
class KVShard:
    """A rank's part of an instance's KV pool: `pool` (2, layers, blocks, heads, block size, head dim)
    holds KV heads `first_head`.. of the model; `path` is its file, where it lives in one (shm). One
    rank: one shard with every head."""

    pool: torch.Tensor
    first_head: int = 0
    path: Path | None = None

    @property
    def heads(self) -> range:
        return range(self.first_head, self.first_head + self.pool.shape[3])


@dataclass(frozen=True)
class KVShardFile:
    """Where a tensor-parallel rank's KV pool lives, as the rank tells the engine (picklable)."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    first_head: int

    @classmethod
    def of_rank(cls, pool: torch.Tensor, path: Path, rank: int, world_size: int, num_kv_heads: int) -> KVShardFile:
        """Rank `rank`'s pool: the KV heads its query heads use (`QKVParallelLinear`'s split: a block
        of heads per rank, or one head kept by `world_size // num_kv_heads` ranks in a row)."""
        local = max(1, num_kv_heads // world_size)
        if pool.shape[3] != local:
            raise ValueError(f"kv_transfer_config: rank {rank} holds {pool.shape[3]} KV heads, not the {local} "
                             f"of {num_kv_heads} heads split over {world_size} ranks")
        first = rank // max(1, world_size // num_kv_heads) * local
        return cls(str(path), tuple(pool.shape), str(pool.dtype), first)

    def open(self) -> KVShard:
        """The rank's pool, mapped into this process."""
        return KVShard(map_pool(self.path, self.shape, _dtype(self.dtype)), self.first_head, Path(self.path))


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise KVTransferError(f"unknown dtype {name!r}")
    return dtype


def token_hash(token_ids: list[int]) -> str:
    """Names a prompt's token ids, so a decode instance refuses KV computed for other tokens."""
    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:32]


def _write_json(stream: BufferedIOBase, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


def _read_json(stream: BufferedIOBase) -> dict[str, Any]:
    line = stream.readline(1 << 20)
    if not line:
        raise KVTransferError("the connection closed before an answer came")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise KVTransferError("a malformed message came")
    return message


@dataclass
class _Hold:
    block_ids: list[int]
    deadline: float


@dataclass
class _Load:
    key: int
    params: dict[str, Any]
    first_block: int
    dst_block_ids: list[int]
    generation: int  # the pools' (`replace_shards`) when the load was asked for


class KVConnector:
    """One instance's side of KV transfers: `send` on a producer, `receive` on a consumer.

    `shards` are the engine's KV pool: one with every head for one rank, one per rank for tensor
    parallelism. A producer's shards must live in files (their `path`) for the shm transport.
    """

    def __init__(self, config: KVTransferConfig, shards: list[KVShard]) -> None:
        self.config = config
        self.shards = shards
        self._generation = 0
        self.blocks_sent = 0
        self.blocks_received = 0
        self.failed_pulls = 0  # a consumer's pulls that raised (their prompts were computed instead)
        self._holds: dict[str, _Hold] = {}
        self._lock = threading.Lock()
        self._released: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
        self._mapped: dict[str, torch.Tensor] = {}  # a consumer's mappings of producers' pool files
        self._server: socketserver.ThreadingTCPServer | None = None
        self._loads: queue.SimpleQueue[_Load | None] = queue.SimpleQueue()
        self._finished: queue.SimpleQueue[tuple[int, KVTransferError | None]] = queue.SimpleQueue()
        self._finished_event = threading.Event()
        if config.is_producer:
            self._server = _KVServer((config.kv_ip, config.kv_port), _KVHandler, self)
            self._thread = threading.Thread(target=self._server.serve_forever, name="kv-connector", daemon=True)
        else:
            self._thread = threading.Thread(target=self._load_forever, name="kv-loads", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The port a producer's KV is served on."""
        assert self._server is not None
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stop serving pulls and remove the pool's file (here, not only at exit: uvicorn ends a
        server stopped by SIGTERM with that signal's default action, which skips atexit)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._loads.put(None)
        # No thread may free a pool tensor after this: a thread's target (this connector's bound
        # method, the server's) references the pools, and a daemon thread that drops the last
        # reference while the interpreter finalizes frees a tensor, whose dealloc releases the GIL;
        # taking it back then ends the thread (pthread_exit) inside torch's C++ frame, and the
        # forced unwind aborts the process: "terminate called without an active exception" at a
        # disaggregated instance's exit (core dump: Thread.run's `del self._target` ->
        # THPVariable_clear -> take_gil -> pthread_exit -> std::terminate).
        self._thread.join(CLOSE_JOIN_S)
        for shard in self.shards:
            if shard.path is not None:
                remove_pool(shard.path)
        self.shards, self._mapped = [], {}

    def replace_shards(self, shards: list[KVShard]) -> None:
        """A restarted tensor-parallel group's new pools. The old pools' KV is gone: transfers held
        there are dropped (their blocks freed by `take_released`); loads asked for before fail, and
        those under way write only the old pools."""
        with self._lock:
            self.shards = shards
            self._generation += 1
            for hold in self._holds.values():
                self._released.put(hold.block_ids)
            self._holds.clear()

    # ----- producer -----------------------------------------------------------------------------

    def check_params(self, params: dict[str, Any], token_ids: list[int]) -> None:
        """ValueError unless `params` fit this side: {"do_remote_decode": true} on a producer, a
        producer's answer for these very tokens on a consumer."""
        if not isinstance(params, dict):
            raise ValueError(f"kv_transfer_params: expected an object, got {params!r}")
        if self.config.is_producer:
            if params != {"do_remote_decode": True}:
                raise ValueError('kv_transfer_params: a prefill instance takes {"do_remote_decode": true}')
            return
        if not isinstance(params.get("transfer_id"), str):
            raise ValueError("kv_transfer_params: a decode instance takes a prefill instance's "
                             "kv_transfer_params (transfer_id, num_tokens, token_hash)")
        if params.get("num_tokens") != len(token_ids) or params.get("token_hash") != token_hash(token_ids):
            raise ValueError("kv_transfer_params: the prompt is not the one the prefill instance computed")

    def send(self, block_ids: list[int], token_ids: list[int]) -> dict[str, Any]:
        """Keep a computed prompt's blocks (the caller holds a reference on each) for one consumer to
        pull; returns the kv_transfer_params that name them."""
        transfer_id = secrets.token_urlsafe(16)
        with self._lock:
            self._holds[transfer_id] = _Hold(list(block_ids), time.monotonic() + self.config.hold_timeout_s)
        return {"transfer_id": transfer_id, "num_tokens": len(token_ids), "token_hash": token_hash(token_ids)}

    def take_released(self) -> list[int]:
        """Blocks the engine may free now: those of finished transfers, and of holds nobody pulled
        in time."""
        released: list[int] = []
        while True:
            try:
                released.extend(self._released.get_nowait())
            except queue.Empty:
                break
        now = time.monotonic()
        with self._lock:
            for transfer_id in [t for t, hold in self._holds.items() if hold.deadline <= now]:
                released.extend(self._holds.pop(transfer_id).block_ids)
        return released

    def num_held_blocks(self) -> int:
        with self._lock:
            return sum(len(hold.block_ids) for hold in self._holds.values())

    def _serve(self, rfile: BufferedIOBase, wfile: BufferedIOBase) -> None:
        """One pull: check the key, take the hold, answer, and release its blocks whatever happens."""
        ask = _read_json(rfile)
        key = self.config.kv_key
        if key is not None and not hmac.compare_digest(str(ask.get("key", "")), key):
            _write_json(wfile, {"ok": False, "error": "wrong kv key"})
            return
        with self._lock:
            hold = self._holds.pop(str(ask.get("transfer_id")), None)
        if hold is None:
            _write_json(wfile, {"ok": False, "error": "unknown or expired transfer"})
            return
        try:
            first, count = ask.get("first_block"), ask.get("count")
            if (not isinstance(first, int) or not isinstance(count, int) or first < 0 or count < 0
                    or first + count > len(hold.block_ids)):
                _write_json(wfile, {"ok": False, "error": f"blocks {first}+{count} are not in the transfer "
                                                           f"({len(hold.block_ids)} blocks)"})
                return
            block_ids = hold.block_ids[first:first + count]
            shards = distinct_heads(self.shards)
            dtype = str(shards[0].pool.dtype)
            if ask.get("transport") == "shm" and all(shard.path is not None for shard in shards):
                _write_json(wfile, {"ok": True, "shard_shape": list(shards[0].pool.shape), "dtype": dtype,
                                    "shards": [{"path": str(s.path), "first_head": s.first_head} for s in shards],
                                    "block_ids": block_ids})
                _read_json(rfile)  # done (or the connection ends): the blocks are copied
            else:  # every head of the blocks in one tensor, whatever the ranks
                parts = [shard.pool[:, :, block_ids] for shard in shards]
                blocks = torch.cat(parts, dim=3) if len(parts) > 1 else parts[0].contiguous()
                _write_json(wfile, {"ok": True, "shard_shape": list(blocks.shape), "dtype": dtype,
                                    "shards": [{"first_head": shards[0].first_head}],
                                    "nbytes": blocks.numel() * blocks.element_size()})
                wfile.write(blocks.view(-1).view(torch.uint8).numpy().data)
                wfile.flush()
            self.blocks_sent += count
        finally:
            self._released.put(hold.block_ids)

    # ----- consumer -----------------------------------------------------------------------------

    def start_load(self, key: int, params: dict[str, Any], first_block: int, dst_block_ids: list[int]) -> None:
        """Pull like `receive`, on the connector's thread; `finished_loads` says when, under `key`
        (an id of the caller's choosing).
        The caller keeps `dst_block_ids` allocated until then (they are written meanwhile)."""
        self._loads.put(_Load(key, params, first_block, list(dst_block_ids), self._generation))

    def finished_loads(self) -> list[tuple[int, KVTransferError | None]]:
        """The loads that ended since the last call: (key, None) when filled, (key, why) when not."""
        self._finished_event.clear()
        done: list[tuple[int, KVTransferError | None]] = []
        while True:
            try:
                done.append(self._finished.get_nowait())
            except queue.Empty:
                return done

    def wait_for_loads(self, timeout: float) -> None:
        """Until a load ends (or `timeout` seconds): an engine with nothing else to run waits here
        instead of spinning."""
        self._finished_event.wait(timeout)

    def _load_forever(self) -> None:
        while (load := self._loads.get()) is not None:
            error = None
            with self._lock:  # the pools the load was asked for, or none: they are gone
                shards = self.shards if load.generation == self._generation else None
            try:
                if shards is None:
                    raise KVTransferError("this instance's tensor-parallel group restarted before the pull")
                self.receive(load.params, load.first_block, load.dst_block_ids, shards)
                if load.generation != self._generation:
                    raise KVTransferError("this instance's tensor-parallel group restarted during the pull")
            except KVTransferError as exc:
                error = exc
            self._finished.put((load.key, error))
            self._finished_event.set()

    def receive(self, params: dict[str, Any], first_block: int, dst_block_ids: list[int],
                shards: list[KVShard] | None = None) -> None:
        """Fill `dst_block_ids` with the transfer's blocks from `first_block` on (the ones before
        are in this pool's prefix cache), in `shards` (default: this instance's pools).
        KVTransferError when the producer cannot give them."""
        ask = {"key": self.config.kv_key, "transfer_id": params["transfer_id"], "first_block": first_block,
               "count": len(dst_block_ids), "transport": self.config.kv_transport}
        address = (self.config.kv_ip, self.config.kv_port)
        try:
            self._pull(address, ask, dst_block_ids, shards or self.shards)
        except (OSError, ValueError, KeyError, KVTransferError) as exc:
            self.failed_pulls += 1
            if isinstance(exc, KVTransferError):
                raise
            raise KVTransferError(f"the prefill instance at {address[0]}:{address[1]} failed: "
                                  f"{type(exc).__name__}: {exc}") from None
        self.blocks_received += len(dst_block_ids)

    def _pull(self, address: tuple[str, int], ask: dict[str, Any], dst_block_ids: list[int],
              shards: list[KVShard]) -> None:
        with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S) as sock:
            sock.settimeout(TRANSFER_TIMEOUT_S)
            with sock.makefile("rwb") as stream:
                _write_json(stream, ask)
                answer = _read_json(stream)
                if not answer.get("ok"):
                    raise KVTransferError(f"the prefill instance refused: {answer.get('error')}")
                self._check_layout(answer, shards)
                if "block_ids" in answer:
                    if len(answer["block_ids"]) != len(dst_block_ids):
                        raise KVTransferError(f"{len(answer['block_ids'])} blocks offered for {len(dst_block_ids)}")
                    copy_heads(shards, dst_block_ids, self._map(answer), answer["block_ids"])
                    _write_json(stream, {"done": True})
                else:
                    blocks = self._read_blocks(stream, answer, len(dst_block_ids))
                    copy_heads(shards, dst_block_ids, [blocks], list(range(len(dst_block_ids))))

    @staticmethod
    def _check_layout(answer: dict[str, Any], shards: list[KVShard]) -> None:
        """The producer's blocks must be this pool's model and dtype, with the same KV heads in all."""
        theirs, ours, dtype = list(answer["shard_shape"]), list(shards[0].pool.shape), shards[0].pool.dtype
        their_heads = {h for s in answer["shards"] for h in range(s["first_head"], s["first_head"] + theirs[3])}
        our_heads = {h for shard in shards for h in shard.heads}
        if theirs[:2] + theirs[4:] != ours[:2] + ours[4:] or answer["dtype"] != str(dtype) or their_heads != our_heads:
            raise KVTransferError(f"the prefill instance's KV blocks are {theirs} {answer['dtype']} over "
                                  f"{len(their_heads)} KV heads, this pool's {ours} {dtype} over "
                                  f"{len(our_heads)}: the two must serve the same model and dtype")

    def _map(self, answer: dict[str, Any]) -> list[KVShard]:
        """The producer's pool files, mapped once per file. New files are a new producer (one that
        was restarted): the old mappings go, else they would keep a dead producer's whole pool in
        memory after its files were swept."""
        paths = [shard["path"] for shard in answer["shards"]]
        if set(paths) != set(self._mapped):
            self._mapped.clear()
            for path in paths:
                self._mapped[path] = map_pool(path, answer["shard_shape"], _dtype(answer["dtype"]))
        return [KVShard(self._mapped[s["path"]], s["first_head"]) for s in answer["shards"]]

    def _read_blocks(self, stream: BufferedIOBase, answer: dict[str, Any], count: int) -> KVShard:
        shape = list(answer["shard_shape"])
        dtype = self.shards[0].pool.dtype
        if shape[2] != count:
            raise KVTransferError(f"{shape[2]} blocks announced for {count}")
        data = bytearray(answer["nbytes"])
        if len(data) != math.prod(shape) * dtype.itemsize:
            raise KVTransferError(f"{len(data)} bytes announced for {count} blocks")
        view, got = memoryview(data), 0
        while got < len(data):
            read = stream.readinto(view[got:])
            if not read:
                raise KVTransferError(f"the connection closed after {got} of {len(data)} bytes")
            got += read
        first_head = answer["shards"][0]["first_head"]
        if not data:
            return KVShard(torch.empty(shape, dtype=dtype), first_head)
        return KVShard(torch.frombuffer(data, dtype=torch.uint8).view(dtype).view(shape), first_head)


def distinct_heads(shards: list[KVShard]) -> list[KVShard]:
    """One shard per set of heads, by first head: ranks that keep copies of one KV head hold the same KV."""
    by_head: dict[int, KVShard] = {}
    for shard in shards:
        by_head.setdefault(shard.first_head, shard)
    return [by_head[head] for head in sorted(by_head)]


def copy_heads(dst: list[KVShard], dst_ids: list[int], src: list[KVShard], src_ids: list[int]) -> None:
    """Each dst shard's blocks dst_ids[i] = src's blocks src_ids[i], head by head from whichever src
    shard holds the head: any split of the KV heads over ranks into any other."""
    for to in dst:
        for of in src:
            low, high = max(to.heads.start, of.heads.start), min(to.heads.stop, of.heads.stop)
            if low < high:
                copy_blocks(to.pool.narrow(3, low - to.first_head, high - low), dst_ids,
                            of.pool.narrow(3, low - of.first_head, high - low), src_ids)


def copy_blocks(dst: torch.Tensor, dst_ids: list[int], src: torch.Tensor, src_ids: list[int]) -> None:
    """dst's blocks dst_ids[i] = src's blocks src_ids[i] (pools of (2, layers, blocks, ...)), a slice
    copy per run of ids consecutive on both sides. Why: `dst[:, :, ids] = src[:, :, ids]` gathers
    into a temporary and scatters it, and this runs on the decode instance's one core beside its
    steps: a 2k-token prompt's 125 blocks of SmolLM2 cost ~70 CPU ms that way, ~11 ms in one run."""
    start = 0
    for end in range(1, len(dst_ids) + 1):
        if end == len(dst_ids) or dst_ids[end] != dst_ids[end - 1] + 1 or src_ids[end] != src_ids[end - 1] + 1:
            count = end - start
            dst[:, :, dst_ids[start]:dst_ids[start] + count].copy_(src[:, :, src_ids[start]:src_ids[start] + count])
            start = end


class _KVServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type, connector: KVConnector) -> None:
        self.connector = connector
        super().__init__(address, handler)


class _KVHandler(socketserver.StreamRequestHandler):
    server: _KVServer

    def handle(self) -> None:
        self.connection.settimeout(TRANSFER_TIMEOUT_S)
        try:
            self.server.connector._serve(self.rfile, self.wfile)
        except (OSError, ValueError, KVTransferError):
            pass  # the consumer is gone or spoke nonsense; the hold was released in _serve

