"""What IDE replicas and runner nodes say to each other through Redis: key names and the run's wire form.

- `codeyard:runs`: a stream of runs to start, read by the runners' consumer group. A runner acknowledges
  an entry in the same transaction that tells the run's watchers it started, so an entry still pending
  was never started: when its reader stops heartbeating, another runner claims and starts it.
- `codeyard:run:<id>:out`: what the run says (started on <runner>, output, waiting for input, files
  copied, the result), read by the replica that dispatched it.
- `codeyard:run:<id>:in`: what it is told (input, end of input, terminal size, cancel).
- `codeyard:runner:<name>`: a runner's heartbeat with its capacity; it expires when the runner dies.
- `codeyard:runner-apps:<name>`: what one runner is told to host (start an app, stop it), by the replica that
  placed the app there; `codeyard:app:<id>:out` what the app says (where its relay listens, its log lines,
  its exit); `codeyard:apps-holder:<token>` the placing replica's keep-alive: a runner stops the apps of a
  holder whose key expired (that replica is gone; its successor starts them again where it chooses).

Runners share the data folder with the replicas (the same volume, at the same path), so a run's spec
names the project and package folders as they are; only the spec, the output and the result travel. A package
install's spec names the index hosts it may reach; its runner serves that proxy itself (nothing of the replica's
machine but the shared folders is reachable from a runner on another machine).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sandbox.backend import Mount, RunSpec
from sandbox.hosted import HostedSpec
from sandbox.limits import Limits
from sandbox.verdict import RunResult, Verdict

RUNS_STREAM = "codeyard:runs"
GROUP = "runners"
HEARTBEAT_S = 1.0  # a runner renews its heartbeat this often...
HEARTBEAT_TTL_MS = 4000  # ...and is taken for dead once it is this old
RUN_KEYS_TTL_S = 3600  # a run's in/out streams are kept this long after their last entry
REDIS_OUTAGE_S = 30.0  # how long a run's messages are retried while Redis is away (a restart) before giving up

log = logging.getLogger(__name__)
T = TypeVar("T")
Fields = dict[bytes, bytes]  # a stream entry's fields (the clients here do not decode replies)
Entry = tuple[bytes, Fields]  # (entry id, fields)


def stream_entries(reply: object) -> list[Entry]:
    """The entries of a one-stream XREAD/XREADGROUP reply (RESP2: [[stream, [(id, fields), ...]]]; None: none)."""
    streams = cast(list[tuple[bytes, list[Entry]]] | None, reply)
    return streams[0][1] if streams else []


async def patiently(call: Callable[[], Awaitable[T]]) -> T:
    """call() again while Redis cannot be reached (restarting, loading its data), for up to REDIS_OUTAGE_S."""
    deadline = time.monotonic() + REDIS_OUTAGE_S
    while True:
        try:
            return await call()
        except (RedisConnectionError, RedisTimeoutError) as exc:  # BusyLoadingError is a ConnectionError
            if time.monotonic() > deadline:
                raise
            log.warning("Redis is away (%s); trying again", exc)
            await asyncio.sleep(0.5)


def out_key(run_id: str) -> str:
    return f"codeyard:run:{run_id}:out"


def in_key(run_id: str) -> str:
    return f"codeyard:run:{run_id}:in"


def heartbeat_key(runner: str) -> str:
    return f"codeyard:runner:{runner}"


def apps_key(runner: str) -> str:
    return f"codeyard:runner-apps:{runner}"


def app_out_key(app_id: str) -> str:
    return f"codeyard:app:{app_id}:out"


def holder_key(holder: str) -> str:
    return f"codeyard:apps-holder:{holder}"


def _mounts(mounts: tuple[Mount, ...]) -> list[dict[str, object]]:
    return [{"source": str(m.source), "target": m.target, "writable": m.writable, "owned_by_run": m.owned_by_run}
            for m in mounts]


def _decode_mounts(data: list[dict[str, Any]]) -> tuple[Mount, ...]:
    return tuple(Mount(Path(m["source"]), m["target"], m["writable"], m.get("owned_by_run", False)) for m in data)


def encode_spec(spec: RunSpec) -> str:
    return json.dumps({
        "argv": list(spec.argv), "project_dir": str(spec.project_dir), "limits": dataclasses.asdict(spec.limits),
        "env": dict(spec.env), "terminal": spec.terminal, "mounts": _mounts(spec.mounts),
        "input_wait_seconds": spec.input_wait_seconds, "sync_seconds": spec.sync_seconds,
        "index_hosts": sorted(spec.index_hosts),
    })


def encode_hosted(spec: HostedSpec) -> str:
    return json.dumps({"release_dir": str(spec.release_dir), "argv": list(spec.argv), "port": spec.port,
                       "limits": dataclasses.asdict(spec.limits), "env": dict(spec.env), "mounts": _mounts(spec.mounts),
                       "cpus": spec.cpus})


def decode_hosted(text: str | bytes) -> HostedSpec:
    data = json.loads(text)
    return HostedSpec(Path(data["release_dir"]), [str(a) for a in data["argv"]], int(data["port"]),
                      Limits(**data["limits"]), dict(data["env"]), _decode_mounts(data["mounts"]), float(data["cpus"]))


def decode_spec(text: str | bytes) -> RunSpec:
    """The spec as sent; RunSpec's own checks run again here (the runner trusts no one's paths blindly)."""
    data = json.loads(text)
    return RunSpec(
        argv=data["argv"], project_dir=Path(data["project_dir"]), limits=Limits(**data["limits"]), env=data["env"],
        terminal=tuple(data["terminal"]) if data["terminal"] else None,
        mounts=_decode_mounts(data["mounts"]),
        input_wait_seconds=data["input_wait_seconds"], sync_seconds=data["sync_seconds"],
        index_hosts=frozenset(str(host) for host in data.get("index_hosts", ())),
    )


def encode_result(result: RunResult) -> str:
    """The result without its output, which went before it chunk by chunk."""
    fields = dataclasses.asdict(result)
    del fields["stdout"], fields["stderr"]
    fields["verdict"] = result.verdict.value
    return json.dumps(fields)


def decode_result(text: str | bytes, stdout: bytes, stderr: bytes) -> RunResult:
    fields = json.loads(text)
    fields["verdict"] = Verdict(fields["verdict"])
    return RunResult(**fields, stdout=stdout, stderr=stderr)
