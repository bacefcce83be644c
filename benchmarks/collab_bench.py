"""Fan-out latency and server CPU of our collab server vs the reference y-websocket server.

For each client count N, the same load (N human-speed typists, a few more human-speed typists
that are stock Yjs clients timing every keystroke, and one fast typist; see tests/collab/js/load.js)
runs against our server (the test harness app under
uvicorn, SQLite store, disk mirror on) and against y-websocket@1.5.4's bin/server.js (in-memory,
no persistence). Prints p50/p99 keystroke-to-observer latency, server CPU and the p99 ratio.

Usage: .venv/bin/python benchmarks/collab_bench.py [--clients 10,50,200] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "collab"))

from collab_testkit import JS_DIR, CollabServer, ensure_node_modules, free_port, token  # noqa: E402

PROJECT = "bench"
FILE = "doc.txt"


class ReferenceServer:
    """y-websocket@1.5.4 bin/server.js: the de-facto reference y-websocket server."""

    def __init__(self) -> None:
        self.port = free_port()
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["node", str(JS_DIR / "node_modules" / "y-websocket" / "bin" / "server.js")],
            env={**os.environ, "HOST": "127.0.0.1", "PORT": str(self.port)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any(c.laddr.port == self.port for c in psutil.Process(self.process.pid).net_connections()):
                return
            time.sleep(0.1)
        raise RuntimeError("reference server did not start")

    def stop(self) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(10)


def run_load(pid: int, url_prefix: str, room: str, query: str, humans: int, args) -> dict:
    """The crowd (N human typists) and, once it is connected, the timed clients; server CPU meanwhile."""
    base = {
        "urlPrefix": url_prefix, "room": room, "query": query, "seconds": args.seconds,
        "humanMs": args.human_ms, "fastMs": args.fast_ms, "observers": args.observers, "warmupMs": 1000,
    }
    timed = node_load({**base, "mode": "timed"}, stdin=subprocess.PIPE)
    crowd = node_load({**base, "mode": "crowd", "humans": humans}, stdin=subprocess.PIPE)
    try:
        for proc, name in ((timed, "timed clients"), (crowd, "crowd")):
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{name} failed to connect: {proc.stderr.read()[-2000:]}")
        server = psutil.Process(pid)
        cpu_before, wall_before = server.cpu_times(), time.monotonic()
        timed.stdin.write("go\n")
        timed.stdin.close()
        out = timed.stdout.read()
        timed.wait(args.seconds + 120)
        cpu_after, wall = server.cpu_times(), time.monotonic() - wall_before
        if timed.returncode != 0:
            raise RuntimeError(f"timed clients failed: {timed.stderr.read()[-2000:]}")
        crowd.stdin.close()
        crowd_out = crowd.stdout.read()
        crowd.wait(60)
    finally:
        for proc in (timed, crowd):
            if proc.poll() is None:
                proc.kill()
    result = json.loads(out)
    cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    result["cpu_percent"] = 100 * cpu / wall
    result["crowd_messages_per_sec"] = json.loads(crowd_out.splitlines()[-1])["messagesPerSec"]
    return result


def node_load(config: dict, **popen) -> subprocess.Popen:
    return subprocess.Popen(["node", str(JS_DIR / "load.js"), json.dumps(config)], cwd=JS_DIR,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def bench_ours(humans: int, args, workdir: Path) -> dict:
    root = workdir / f"ours-{humans}"
    (root / PROJECT).mkdir(parents=True)
    (root / PROJECT / FILE).write_text("", encoding="utf-8")
    server = CollabServer(args.db_url or f"sqlite:///{root / 'collab.db'}", root, root / "server.log")
    server.start()
    try:
        return run_load(server.process.pid, f"{server.ws_url}/ws/collab/{PROJECT}", FILE,
                        f"token={token('bench')}", humans, args)
    finally:
        server.stop()


def bench_reference(humans: int, args) -> dict:
    server = ReferenceServer()
    server.start()
    try:
        return run_load(server.process.pid, server.ws_url, "bench", "", humans, args)
    finally:
        server.stop()


def ratio(results: dict[str, dict], field: str) -> str:
    ours, ref = results["ours"][field], results["reference"][field]
    if ours is None or not ref:
        return "n/a (no sample from one side within the window)"
    return f"{ours / ref:.2f}x"


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:8.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="10,50,200", help="comma-separated crowd sizes (human-speed typists)")
    parser.add_argument("--seconds", type=float, default=10.0, help="typing time per run")
    parser.add_argument("--human-ms", type=float, default=400.0, help="mean ms between a human's keystrokes")
    parser.add_argument("--fast-ms", type=float, default=30.0, help="mean ms between the fast typist's keystrokes")
    parser.add_argument("--db-url", help="database for our server (default: a fresh SQLite file)")
    parser.add_argument("--observers", type=int, default=4, help="clients that time the fan-out")
    args = parser.parse_args()
    ensure_node_modules()
    counts = [int(n) for n in args.clients.split(",")]
    print(f"load: N crowd typists + {args.observers} timed typists at one key per ~{args.human_ms:.0f} ms, one fast "
          f"typist at one key per ~{args.fast_ms:.0f} ms, {args.seconds:.0f} s timed per run.\n"
          "latency: keystroke of a timed client or the fast typist -> arrival at each other timed client; "
          "CPU: server process, % of one core")
    header = f"{'N':>5} {'server':>10} {'keys':>6} {'samples':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'CPU %':>7} {'crowd msg/s':>11} {'timed lag':>9}"
    print(header)
    with tempfile.TemporaryDirectory(prefix="collab-bench-") as tmp:
        for humans in counts:
            results = {"ours": bench_ours(humans, args, Path(tmp)), "reference": bench_reference(humans, args)}
            for name, r in results.items():
                print(f"{humans:>5} {name:>10} {r['keystrokes']:>6} {r['samples']:>8} {fmt(r['p50'])} "
                      f"{fmt(r['p99'])} {fmt(r['max'])} {r['cpu_percent']:7.1f} {r['crowd_messages_per_sec']:11.0f} "
                  f"{r['loopLagP99']:7.1f}ms"
                      + ("" if r["samples"] >= 0.99 * r["expectedSamples"] else
                         f"  (only {r['samples']}/{r['expectedSamples']} deliveries timed)"))
            print(f"{humans:>5} {'ratio':>10} ours/reference: p50 {ratio(results, 'p50')}, "
                  f"p99 {ratio(results, 'p99')}, CPU {ratio(results, 'cpu_percent')}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
