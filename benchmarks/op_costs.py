"""Server CPU per classroom operation, one operation kind at a time, against a real `codeyard serve`.

The load test's latencies depend on everything else the host runs; CPU seconds spent by the
server (its threads and the sandbox processes it reaps) per operation do not, so this is the
figure to compare before and after a change to the request path. It also measures what open
editors cost while nobody types (the disk mirror's polling), which decides how many idle
students a server can hold.

Usage: .venv/bin/python benchmarks/op_costs.py [--repeat 100] [--idle-editors 30]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.load_bench import Student, Tally, percentile, server_pid  # noqa: E402
from tests.serve_process import codeyard_serve  # noqa: E402


def server_cpu_s(server: psutil.Process) -> float:
    """CPU seconds of the server's threads and of the children it has waited for (sandboxes)."""
    times = server.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


async def measure(name: str, server: psutil.Process, repeat: int, op: Callable[[int], Awaitable[None]]) -> dict:
    walls: list[float] = []
    cpu_before = server_cpu_s(server)
    for i in range(repeat):
        started = time.monotonic()
        await op(i)
        walls.append(time.monotonic() - started)
    await asyncio.sleep(1.5)  # let the writes an operation schedules (disk mirror, store) land in its bill
    cpu = server_cpu_s(server) - cpu_before
    return {"op": name, "n": repeat, "cpu_ms_per_op": 1000 * cpu / repeat,
            "wall_p50_ms": 1000 * percentile(walls, 0.5)}


async def measure_all(base: str, server: psutil.Process, args: argparse.Namespace) -> list[dict]:
    tally = Tally()
    settings = argparse.Namespace(run_every=1)
    student = Student(base, 0, tally, settings, stop_at=float("inf"), partner=base)
    if not await student.join():
        raise SystemExit(f"could not sign up: {tally.errors[:3]}")
    files = f"/api/projects/{student.project}/files"
    typist, watcher = await student.socket("notes.md"), await student.socket("notes.md")
    assert typist and watcher, tally.errors

    async def keystroke(i: int) -> None:
        await typist.type(f"<{i}>")
        await watcher.wait_for(f"<{i}>", 10)

    async def save(i: int) -> None:
        await student.call("save", "PUT", f"{files}/content/main.py", content=f"print(1)\n# {i}\n".encode())

    results = [
        await measure("tree", server, args.repeat, lambda i: student.call("tree", "GET", files)),
        await measure("save", server, args.repeat, save),
        await measure("read", server, args.repeat, lambda i: student.call("read", "GET", f"{files}/content/main.py")),
        await measure("keystroke", server, args.repeat * 2, keystroke),
        await measure("run (print(1), start to verdict)", server, max(5, args.repeat // 5), lambda i: student.run()),
    ]
    others = [Student(base, i, tally, settings, stop_at=float("inf"), partner=base) for i in range(1, args.idle_editors + 1)]
    for other in others:
        await other.join()
        await other.socket("main.py")
    await asyncio.sleep(12)  # past the disk mirror's quick-poll window after the joins
    cpu_before, started = server_cpu_s(server), time.monotonic()
    await asyncio.sleep(args.idle_seconds)
    idle = (server_cpu_s(server) - cpu_before) / (time.monotonic() - started)
    results.append({"op": f"{args.idle_editors} idle editors, per second", "n": args.idle_editors,
                    "cpu_ms_per_op": 1000 * idle, "wall_p50_ms": float("nan")})
    if tally.errors or tally.timeouts:
        print(f"errors: {tally.errors[:5]} timeouts: {dict(tally.timeouts)}")
    return results


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=100, help="requests per operation kind")
    parser.add_argument("--idle-editors", type=int, default=30, help="students with an editor open, not typing")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="codeyard-costs-", ignore_cleanup_errors=True) as tmp:
        data_dir = Path(tmp)
        data_dir.chmod(0o755)  # sandbox uids read the package environments under it
        with codeyard_serve(data_dir, {}, log_name="serve.log") as base:
            server = psutil.Process(server_pid(base))
            results = asyncio.run(measure_all(base, server, args))
    print(f"{'operation':40} {'n':>5} {'server CPU ms/op':>17} {'wall p50 ms':>12}")
    for r in results:
        print(f"{r['op']:40} {r['n']:5} {r['cpu_ms_per_op']:17.2f} {r['wall_p50_ms']:12.1f}")
    return results


if __name__ == "__main__":
    main()
