"""Sandbox latency and throughput: `print(1)` through each backend beside bare python3, same run.

    .venv/bin/python benchmarks/sandbox_bench.py [--runs 60] [--clients 8] [--backends bwrap,docker]

Prints p50/p99 latency of one run at a time, runs/second with --clients concurrent clients, and the
overhead ratio against `python3 -c 'print(1)'` started directly. Docker latency is measured with
the warm pool refilled between samples (a server not saturated); the throughput figure lets the
pool drain, so it shows the sustained rate, bounded by how fast Docker creates containers. Needs root; for Docker an engine
that answers (DOCKER_HOST) or dockerd installed (then one is started under .services/docker and
stopped at the end), and the runner image (built if missing).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox.backend import Backend, RunSpec  # noqa: E402
from sandbox.limits import Limits  # noqa: E402

PYTHON = "/usr/bin/python3"
ARGV = ["python3", "-c", "print(1)"]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def bare_once() -> None:
    proc = await asyncio.create_subprocess_exec(PYTHON, "-c", "print(1)", stdout=subprocess.PIPE)
    out, _ = await proc.communicate()
    assert out == b"1\n"


def sandbox_once(backend: Backend, project: Path):
    async def once() -> None:
        result = await backend.run(RunSpec(ARGV, project, Limits()))
        assert result.stdout == b"1\n", result
    return once


async def measure(name: str, once, runs: int, clients: int, between=None) -> dict:
    await once()  # warm-up
    latencies = []
    for _ in range(runs):
        if between is not None:
            await between()  # not timed: e.g. let the warm pool refill, as it does between users' clicks
        began = time.perf_counter()
        await once()
        latencies.append(time.perf_counter() - began)
    total = runs * 2
    remaining = iter(range(total))

    async def client() -> None:
        for _ in remaining:
            await once()

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    throughput = total / (time.perf_counter() - began)
    row = {"name": name, "p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
           "mean": statistics.fmean(latencies), "rps": throughput}
    print(f"{name:8s} p50 {row['p50'] * 1000:7.1f} ms   p99 {row['p99'] * 1000:7.1f} ms   "
          f"{clients} clients: {throughput:6.1f} runs/s", flush=True)
    return row


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--backends", default="bwrap,docker")
    parser.add_argument("--pool", type=int, default=8, help="Docker warm pool size (0: a new container per run)")
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="sandbox-bench-"))
    rows = [await measure("bare", bare_once, args.runs, args.clients)]
    dockerd = None
    for name in args.backends.split(","):
        if name == "bwrap":
            from sandbox.backends.bwrap import BwrapBackend

            backend: Backend = BwrapBackend()
        else:
            from sandbox.backends.docker import DockerBackend
            from sandbox.backends.dockerd import LocalDockerd, docker_client
            from sandbox.image import build_image

            client = docker_client()
            if client is None:
                dockerd = LocalDockerd(Path(__file__).resolve().parents[1] / ".services" / "docker")
                client = dockerd.start()
            build_image(client, lambda line: print(f"  image: {line}", flush=True))
            backend = DockerBackend(client, pool_limits=Limits(), pool_size=args.pool)
            await backend.warm_up()
        between = backend.warm_up if getattr(backend, "pool_size", 0) else None
        rows.append(await measure(name, sandbox_once(backend, project), args.runs, args.clients, between))
        if hasattr(backend, "close"):
            await backend.close()
    if dockerd is not None:
        dockerd.stop()
    bare = rows[0]
    print("\noverhead vs bare python3 (latency p50 ratio, throughput ratio):")
    for row in rows[1:]:
        print(f"  {row['name']:8s} latency x{row['p50'] / bare['p50']:5.1f}   throughput x{row['rps'] / bare['rps']:5.2f}")


if __name__ == "__main__":
    asyncio.run(main())
