"""A classroom on one server: N students at once, in steps, against a real `codeyard serve`.

Each simulated student signs up, creates a project, keeps the editor's collab socket open on
`main.py`, and types into `notes.md` from one socket while a second socket (a partner's tab)
watches for each keystroke. Between pauses (mean `--think` seconds) a student reads the file
tree, saves `main.py` through the files API, reads it back (a different text is a lost save), and
every `--run-every` iterations runs the project (`print(1)`) and follows it on its socket to the
verdict, as the workspace does.

Per step it prints per-operation latency percentiles, errors (5xx, wrong answers, lost saves),
timeouts, socket drops, keystroke fan-out latency, and the server's CPU and memory. With
`--postgres URL --redis URL` the server uses them instead of the embedded defaults; `--replicas N
--redis URL` runs N servers on one SQLite file (one host) sharing rooms and runs through Redis.

Usage: .venv/bin/python benchmarks/load_bench.py [--users 10,30,100,200] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import ssl
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import websockets

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from collab.client import CollabClient  # noqa: E402
from tests.serve_process import codeyard_serve  # noqa: E402

TIMEOUT_S = 10.0
# Plain HTTP, but httpx builds a TLS context (loading every CA certificate) per client unless given
# one: for 100 students that blocked the load generator for seconds and looked like server latency.
NO_TLS = ssl.create_default_context()
SERVER_TROUBLE = re.compile(r"\"level\": \"(error|warning|critical)\"|^Traceback")
PASSWORD = "load-test-password"
# After the last student arrives, time for its sign-up and its three sockets before the class is "at work".
ARRIVAL_SETTLE_S = 10.0
PROBE_EVERY_S = 0.05  # the load generator's own delay: how late a timer on its event loop fires


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Tally:
    """What every student of one step saw."""

    steady_from: float = 0.0  # operations started after this are the class at work, past its arrival
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    steady: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)
    timeouts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    socket_drops: int = 0
    requests: int = 0

    def record(self, op: str, started: float) -> None:
        elapsed = time.monotonic() - started
        self.latencies[op].append(elapsed)
        if started >= self.steady_from:
            self.steady[op].append(elapsed)

    def error(self, what: str) -> None:
        if len(self.errors) < 10_000:
            self.errors.append(what)


class Student:
    """One simulated student: an HTTP session, a project and three collab sockets."""

    def __init__(self, base: str, index: int, tally: Tally, args: argparse.Namespace, stop_at: float,
                 partner: str) -> None:
        self.base, self.index, self.tally, self.args, self.stop_at = base, index, tally, args, stop_at
        self.partner = partner  # the replica the partner's tab talks to (the same one with a single server)
        self.http = httpx.AsyncClient(base_url=base, timeout=TIMEOUT_S, verify=NO_TLS)
        self.name = f"s{int(time.time() * 1000) % 10**9}x{index}"
        self.project = ""
        self.random = random.Random(index)
        self.clients: list[CollabClient] = []  # its sockets, closed when it leaves

    async def call(self, op: str, method: str, url: str, **kwargs) -> httpx.Response | None:
        """One request, timed under `op`; None (and a tally entry) on a timeout or an error."""
        started = time.monotonic()
        self.tally.requests += 1
        headers = kwargs.pop("headers", {})
        if csrf := self.http.cookies.get("codeyard_csrf"):
            headers["X-CSRF-Token"] = csrf
        try:
            response = await self.http.request(method, url, headers=headers, **kwargs)
        except httpx.TimeoutException:
            self.tally.timeouts[op] += 1
            return None
        except httpx.HTTPError as exc:
            self.tally.error(f"{op}: {type(exc).__name__} {exc}")
            return None
        self.tally.record(op, started)
        if response.status_code >= 400:
            self.tally.error(f"{op}: {response.status_code} {response.text[:200]}")
            return None
        return response

    async def socket(self, path: str, base: str | None = None) -> CollabClient | None:
        base = base or self.base
        url = base.replace("http", "ws", 1) + f"/ws/collab/{self.project}/{path}"
        started = time.monotonic()
        client = CollabClient()
        try:
            await asyncio.wait_for(client.connect(url, {"Cookie": self.cookie()}, origin=base), TIMEOUT_S)
            self.clients.append(client)
            await asyncio.wait_for(client.synced.wait(), TIMEOUT_S)
        except TimeoutError:
            self.tally.timeouts["socket"] += 1
            return None
        except (OSError, websockets.WebSocketException) as exc:
            self.tally.error(f"socket: {exc}")
            return None
        if client.closed:
            assert client.socket is not None
            self.tally.error(f"socket: closed {client.socket.close_code} {client.socket.close_reason}")
            return None
        self.tally.record("socket", started)
        return client

    async def live(self) -> None:
        try:
            if not await self.join():
                return
            editor = await self.socket("main.py")
            typist, watcher = await self.socket("notes.md"), await self.socket("notes.md", self.partner)
            if not (editor and typist and watcher):
                return
            typing = asyncio.create_task(self.keep_typing(typist, watcher))
            iteration = 0
            while time.monotonic() < self.stop_at:
                await self.work(iteration)
                iteration += 1
                await asyncio.sleep(self.random.expovariate(1 / self.args.think))
            typing.cancel()
            self.tally.socket_drops += sum(client.closed for client in (editor, typist, watcher))
        finally:
            for client in self.clients:
                await client.close()
            await self.http.aclose()

    async def join(self) -> bool:
        body = {"username": self.name, "password": PASSWORD}
        if await self.call("register", "POST", "/api/auth/register", json=body) is None:
            return False
        answer = await self.call("create_project", "POST", "/api/projects", json={"name": "load", "template": "python"})
        if answer is None:
            return False
        self.project = answer.json()["id"]
        notes = f"/api/projects/{self.project}/files/content/notes.md"
        return await self.call("save", "PUT", notes, content=b"# notes\n") is not None

    async def keep_typing(self, typist: CollabClient, watcher: CollabClient) -> None:
        count = 0
        while time.monotonic() < self.stop_at:
            marker = f"<{self.index}:{count}>"
            count += 1
            started = time.monotonic()
            await typist.append(marker)
            if await watcher.wait_for(lambda text: marker in text, TIMEOUT_S):
                self.tally.record("keystroke", started)
            elif not watcher.closed:
                self.tally.timeouts["keystroke"] += 1
            await asyncio.sleep(self.args.keystroke_every)

    async def work(self, iteration: int) -> None:
        files = f"/api/projects/{self.project}/files"
        await self.call("tree", "GET", files)
        text = f"print(1)\n# {self.name} {iteration} {'x' * self.random.randrange(10, 200)}\n"
        if await self.call("save", "PUT", f"{files}/content/main.py", content=text.encode()) is None:
            return
        answer = await self.call("read", "GET", f"{files}/content/main.py")
        if answer is not None and answer.text != text:
            self.tally.error(f"lost save: wrote {text[:40]!r}, read {answer.text[:60]!r}")
        if iteration % self.args.run_every == self.index % self.args.run_every:
            await self.run()

    async def run(self) -> None:
        """Run the project and follow it on its socket, as the workspace does, to the exit frame."""
        started = time.monotonic()
        answer = await self.call("run_start", "POST", f"/api/projects/{self.project}/runs", json={"entry": "main.py"})
        if answer is None:
            return
        run_id = answer.json()["id"]
        url = self.base.replace("http", "ws", 1) + f"/ws/runs/{run_id}"
        stdout = ""
        try:
            async with asyncio.timeout(TIMEOUT_S * 3), websockets.connect(
                    url, additional_headers={"Cookie": self.cookie()}, origin=self.base) as ws:
                async for raw in ws:
                    frame = json.loads(raw)
                    if frame["type"] == "stdout":
                        stdout += frame["data"]
                    elif frame["type"] == "exit":
                        self.verdict(frame["verdict"], frame["message"], stdout, started)
                        return
            self.tally.error("run: its socket closed before the exit frame")
        except TimeoutError:
            self.tally.timeouts["run_e2e"] += 1
        except (OSError, websockets.WebSocketException) as exc:
            self.tally.error(f"run socket: {type(exc).__name__} {exc}")

    def verdict(self, verdict: str, message: str, stdout: str, started: float) -> None:
        if verdict != "ok" or stdout != "1\n":
            self.tally.error(f"run: {verdict} {message!r} {stdout[:60]!r}")
        else:
            self.tally.record("run_e2e", started)

    def cookie(self) -> str:
        return "; ".join(f"{k}={v}" for k, v in self.http.cookies.items())


def server_pid(base: str) -> int:
    """The `codeyard serve` listening on the server's port (with --workers: the parent of the workers)."""
    port = int(base.rsplit(":", 1)[1])
    holder = psutil.Process(next(c.pid for c in psutil.net_connections("tcp")
                                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port))
    parent = holder.parent() if "ide_server.workers" in holder.cmdline() else None  # (the socket is shared)
    return parent.pid if parent is not None else holder.pid


def server_processes(pid: int) -> list[psutil.Process]:
    """The server and, with --workers, its workers and private Redis (not the sandboxed runs)."""
    server = psutil.Process(pid)
    return [server] + [c for c in server.children() if "ide_server.workers" in c.cmdline() or c.name() == "redis-server"]


def process_role(process: psutil.Process) -> str:
    return "worker" if "ide_server.workers" in process.cmdline() else "redis" if process.name() == "redis-server" else "serve"


def workers_serving(log: Path, asked: int | None) -> int:
    """How many workers the server runs, once all of them serve: its first line gives the count (unless
    asked for one: then it says nothing of workers), and with several the parent says so when the last
    one serves."""
    if asked == 1:
        return 1
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if found := re.search(r"codeyard: (\d+) workers? \(", text):
            count = int(found.group(1))
            if count == 1 or "workers (pids" in text:
                return count
        time.sleep(0.5)
    raise SystemExit("the server's workers did not all start")


def cpu_seconds(processes: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in processes)


async def run_step(bases: list[str], users: int, args: argparse.Namespace, server_pids: list[int]) -> dict:
    """One step: `users` students for `args.seconds`, spread over the replicas; the summary as a dict."""
    tops, client = [psutil.Process(pid) for pid in server_pids], psutil.Process()
    servers = [p for pid in server_pids for p in server_processes(pid)]
    cpu_before, client_before, started = cpu_seconds(servers), cpu_seconds([client]), time.monotonic()
    tally = Tally(steady_from=started + args.ramp + ARRIVAL_SETTLE_S)
    cpu_each = [cpu_seconds([p]) for p in servers]
    stop_at = started + args.seconds
    ramp = args.ramp / max(1, users)

    async def student(i: int) -> None:
        await asyncio.sleep(i * ramp)
        await Student(bases[i % len(bases)], i, tally, args, stop_at, partner=bases[(i + 1) % len(bases)]).live()

    probe = asyncio.create_task(probe_delay(tally, stop_at))
    await asyncio.gather(*(student(i) for i in range(users)))
    probe.cancel()
    elapsed = time.monotonic() - started
    cpu = cpu_seconds(servers) - cpu_before
    by_process = {f"{process_role(p)} {p.pid}": round(100 * (cpu_seconds([p]) - before) / elapsed, 1)
                  for p, before in zip(servers, cpu_each)}
    client_cpu = cpu_seconds([client]) - client_before
    memory = sum(s.memory_info().rss + sum(c.memory_info().rss for c in s.children(recursive=True)) for s in tops)
    ops, steady_ops = latency_summary(tally.latencies), latency_summary(tally.steady)
    return {
        "users": users, "seconds": round(elapsed, 1), "requests": tally.requests,
        "req_per_s": round(tally.requests / elapsed, 1), "ops": ops,
        "api_p99_ms": api_p99_ms(tally.latencies), "steady_ops": steady_ops,
        "steady_api_p99_ms": api_p99_ms(tally.steady), "steady_after_s": args.ramp + ARRIVAL_SETTLE_S, "errors": len(tally.errors), "error_samples": tally.errors[:5],
        "timeouts": sum(tally.timeouts.values()), "timeouts_by_op": dict(tally.timeouts),
        "socket_drops": tally.socket_drops, "server_cpu_percent": round(100 * cpu / elapsed, 1),
        "server_cpu_percent_by_process": by_process,
        "server_rss_mb": round(memory / 2**20, 1), "load_generator_cpu_percent": round(100 * client_cpu / elapsed, 1),
        "host_load_average": os.getloadavg()[0],
    }


async def probe_delay(tally: Tally, stop_at: float) -> None:
    """How late the generator's own loop wakes (in every latency it measures, not the server's doing):
    recorded as the 'generator_delay' operation."""
    while time.monotonic() < stop_at:
        started = time.monotonic()
        await asyncio.sleep(PROBE_EVERY_S)
        tally.record("generator_delay", started + PROBE_EVERY_S)


def latency_summary(latencies: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {op: {"n": len(v), "p50_ms": percentile(v, 0.5) * 1000, "p99_ms": percentile(v, 0.99) * 1000}
            for op, v in sorted(latencies.items())}


def api_p99_ms(latencies: dict[str, list[float]]) -> float:
    api = [v for op, values in latencies.items() if op not in ("keystroke", "run_e2e", "socket", "generator_delay") for v in values]
    return percentile(api, 0.99) * 1000


def print_step(result: dict) -> None:
    print(f"\n== {result['users']} users, {result['seconds']} s: {result['req_per_s']} req/s, "
          f"errors {result['errors']}, timeouts {result['timeouts']} {result['timeouts_by_op'] or ''}, "
          f"socket drops {result['socket_drops']}, server CPU {result['server_cpu_percent']}%, RSS {result['server_rss_mb']} MB")
    if len(result["server_cpu_percent_by_process"]) > 1:
        print(f"   server CPU % by process: {result['server_cpu_percent_by_process']}")
    print(f"   load generator CPU {result['load_generator_cpu_percent']}%, host load average {result['host_load_average']:.1f}")
    print(f"   API p99 {result['api_p99_ms']:.0f} ms")
    for op, figures in result["ops"].items():
        print(f"   {op:14} n={figures['n']:6}  p50 {figures['p50_ms']:8.1f} ms  p99 {figures['p99_ms']:8.1f} ms")
    print(f"   at work (operations started {result['steady_after_s']:.0f} s or more into the step, after the class "
          f"arrived): API p99 {result['steady_api_p99_ms']:.0f} ms")
    for op, figures in result["steady_ops"].items():
        print(f"   {op:14} n={figures['n']:6}  p50 {figures['p50_ms']:8.1f} ms  p99 {figures['p99_ms']:8.1f} ms")
    for sample in result["error_samples"]:
        print(f"   error: {sample}")
    print("   in the server (its request log):")
    for route, figures in result["server_side_ms"].items():
        print(f"   {route[:58]:58} n={figures['n']:6}  p50 {figures['p50_ms']:8.1f} ms  p99 {figures['p99_ms']:8.1f} ms")
    print(f"   server log: {len(result['server_log_errors'])} error lines")
    for line in result["server_log_errors"][:8]:
        print(f"   | {line}")


def server_side_latency(lines: list[str]) -> dict[str, dict[str, float]]:
    """p50/p99 of the server's own request durations per route (its request log), to tell time
    spent in the server from time spent queueing before it."""
    durations: dict[str, list[float]] = defaultdict(list)
    for line in lines:
        if '"event": "request"' not in line:
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # --workers: two workers' lines can meet on their shared stderr
            continue
        if entry.get("method") != "WS":
            durations[f"{entry['method']} {entry.get('route')}"].append(entry["duration_ms"])
    return {route: {"n": len(v), "p50_ms": percentile(v, 0.5), "p99_ms": percentile(v, 0.99)}
            for route, v in sorted(durations.items()) if len(v) >= 10}


def summarise_log_line(line: str) -> str:
    """A server log line as its message, its exception's last line and the innermost frame of ours."""
    try:
        entry = json.loads(line)
    except ValueError:
        return line[:300]
    trace = entry.get("exception", "").splitlines()
    ours = [t.strip() for t in trace if t.strip().startswith("File") and "site-packages" not in t]
    return " | ".join(filter(None, [entry.get("event", "").strip(), trace[-1] if trace else "", ours[-1] if ours else ""]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", default="10,30,100,200", help="students per step, comma-separated")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each step")
    parser.add_argument("--ramp", type=float, default=5.0, help="seconds over which a step's students arrive")
    parser.add_argument("--think", type=float, default=2.0, help="mean pause between a student's iterations")
    parser.add_argument("--keystroke-every", type=float, default=0.5, help="seconds between a student's keystrokes")
    parser.add_argument("--run-every", type=int, default=8, help="run the program every N iterations")
    parser.add_argument("--postgres", help="SQLAlchemy URL of an empty PostgreSQL database (else SQLite)")
    parser.add_argument("--redis", help="Redis URL (what several replicas share besides the database)")
    parser.add_argument("--replicas", type=int, default=1, help="servers sharing the data (needs --redis for more "
                        "than one; on SQLite they share its file); each student's partner tab talks to the next one")
    parser.add_argument("--workers", type=int, help="`codeyard serve --workers N` (processes on one port, a private "
                        "Redis unless --redis; default: serve's own, a worker per core)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.replicas > 1 and not args.redis:
        raise SystemExit("--replicas above 1 needs --redis (what several replicas share besides the database)")
    settings: dict[str, str | None] = {}
    if args.postgres:
        settings["CODEYARD_DATABASE_URL"] = args.postgres
    if args.redis:
        settings["CODEYARD_REDIS_URL"] = args.redis
    settings["CODEYARD_WORKERS"] = str(args.workers) if args.workers else None  # None: serve's default
    results = []
    with ExitStack() as stack:
        data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="codeyard-load-", ignore_cleanup_errors=True)))
        data_dir.chmod(0o755)  # sandbox uids read the package environments under it
        bases = [stack.enter_context(codeyard_serve(data_dir, settings, log_name=f"serve{i}.log"))
                 for i in range(args.replicas)]
        pids = [server_pid(base) for base in bases]
        workers = [workers_serving(data_dir / f"serve{i}.log", args.workers) for i in range(len(bases))]
        print(f"{len(bases)} server(s) {' '.join(bases)} (pids {pids}, {'/'.join(map(str, workers))} worker(s) each) on {'PostgreSQL' if args.postgres else 'SQLite'}"
              f"{' + Redis' if args.redis else ''}; think {args.think} s, keystroke every {args.keystroke_every} s, "
              f"run every {args.run_every} iterations")
        logs, seen = [data_dir / f"serve{i}.log" for i in range(len(bases))], [0] * len(bases)
        for users in (int(u) for u in args.users.split(",")):
            result = asyncio.run(run_step(bases, users, args, pids))
            lines = []
            for i, log in enumerate(logs):
                all_lines = log.read_text(errors="replace").splitlines()
                lines += all_lines[seen[i]:]
                seen[i] = len(all_lines)
            result["server_log_errors"] = [summarise_log_line(line) for line in lines if SERVER_TROUBLE.search(line)]
            result["server_side_ms"] = server_side_latency(lines)
            print_step(result)
            results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
