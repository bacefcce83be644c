"""Deploys: click-to-live seconds for a cached Flask app, and requests/second through the proxy vs direct.

    .venv/bin/python benchmarks/deploy_bench.py [--deploys 7] [--seconds 8] [--rounds 4] [--connections 8]

Starts `codeyard serve` (SQLite, temporary data dir, bubblewrap; the package cache of the deploy
tests, so Flask is installed once and then cached), signs a user up and deploys a Flask app.
- click-to-live: from POST /deployments until the proxy serves the new release's text, for
  --deploys redeploys each with a changed app.py (the packages are cached; each is a fresh
  checkpoint, snapshot, sandbox start and health check, then the switch). Goal: p50 < 3 s.
- throughput: the same keep-alive HTTP/1.1 client (raw asyncio, --connections connections)
  against the app directly (its instance's unix socket, the in-sandbox bridge included, since
  that is the app's only door), through the apps' own port (the edge: the URL apps get when
  CODEYARD_DEPLOY_APPS_PORT is set, as `make serve` and compose do) and through /apps/{slug}/ on
  the IDE's port (the ASGI gateway), alternated over --rounds rounds. Prints each (mean req/s)
  and the ratios. Goal: the apps' proxy >= 70% of direct.
  Measured twice: for the Flask deploy as it runs (on waitress: threads, keep-alive), and for the
  same app on Flask's development server (set in codeyard.toml), which closes the connection after
  each answer, so both sides reconnect per request. The proxy costs the same CPU per request in
  both; the ratio says how that compares with what the app itself costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from serve_process import codeyard_serve, free_port  # noqa: E402

from deploy_service.detect import PORT  # noqa: E402

PASSWORD = "correct horse battery"
APP = 'from flask import Flask\napp = Flask(__name__)\n\n@app.get("/")\ndef home():\n    return "{version}"\n'


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def click_to_live(client: httpx.Client, base: str, project_id: str, version: str, write: bool = True) -> float:
    """Seconds from the deploy click until the app at its URL answers with `version`."""
    if write:
        client.put(f"/api/projects/{project_id}/files/content/app.py", content=APP.replace("{version}", version).encode()).raise_for_status()
    began = time.perf_counter()
    response = client.post(f"/api/projects/{project_id}/deployments")
    response.raise_for_status()
    url, release_id = response.json()["url"], response.json()["releases"][0]["id"]
    while True:
        if client.get(base + url).text == version:
            return time.perf_counter() - began
        release = next(r for r in client.get(f"/api/projects/{project_id}/deployment").json()["releases"] if r["id"] == release_id)
        if release["status"] == "failed":
            raise RuntimeError(f"deploy failed: {release['message']}")
        time.sleep(0.01)


async def _connection(open_connection, request: bytes, until: float, expected: bytes) -> int:
    """Send requests one after another on one connection (a new one when the server closes it)."""
    done = 0
    while time.perf_counter() < until:
        reader, writer = await asyncio.wait_for(open_connection(), 10)
        try:
            while time.perf_counter() < until:
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])}
                body = await reader.readexactly(int(headers[b"content-length"]))
                if not head.startswith(b"HTTP/1.1 200") or body != expected:
                    raise RuntimeError(f"unexpected answer: {head[:80]!r} {body[:80]!r}")
                done += 1
                if headers.get(b"connection", b"").lower() == b"close":
                    break  # Flask's server closes after each answer
        finally:
            writer.close()
    return done


async def throughput(open_connection, path: str, host: str, connections: int, seconds: float, expected: bytes) -> float:
    """Requests/second of `connections` keep-alive connections each sending one request at a time."""
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: keep-alive\r\n\r\n".encode()
    await _connection(open_connection, request, time.perf_counter() + 0.5, expected)  # warm-up
    began = time.perf_counter()
    counts = await asyncio.gather(*(_connection(open_connection, request, began + seconds, expected) for _ in range(connections)))
    return sum(counts) / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deploys", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=8.0, help="of load on each side, over all rounds")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4, help="direct and proxy measurements, alternated")
    args = parser.parse_args()
    packages = Path(os.environ.get("CODEYARD_CACHE_DIR", REPO / ".codeyard" / "cache")) / "deploy-packages"
    packages.mkdir(parents=True, exist_ok=True)
    runs_dir = Path(tempfile.mkdtemp(prefix="codeyard-bench-runs-"))  # this server's workspaces and app sockets
    apps_port = free_port()
    os.environ.update(CODEYARD_PACKAGES_DIR=str(packages), CODEYARD_SANDBOX_DIR=str(runs_dir), CODEYARD_LOG_LEVEL="warning",
                      CODEYARD_DEPLOY_APPS_PORT=str(apps_port))
    with tempfile.TemporaryDirectory(prefix="codeyard-deploy-bench-") as data, codeyard_serve(Path(data)) as base:
        client = httpx.Client(base_url=base, timeout=120)
        client.post("/api/auth/register", json={"username": "bencher", "password": PASSWORD}).raise_for_status()
        client.headers["X-CSRF-Token"] = client.cookies["codeyard_csrf"]
        project_id = client.post("/api/projects", json={"name": "bench app"}).json()["id"]
        first = click_to_live(client, base, project_id, "v0")
        print(f"first deploy (installs Flask unless cached): {first:.2f} s")
        seconds = [click_to_live(client, base, project_id, f"v{i}") for i in range(1, args.deploys + 1)]
        p50 = statistics.median(seconds)
        print(f"click-to-live, Flask, packages cached ({args.deploys} deploys): p50 {p50:.2f} s, "
              f"max {max(seconds):.2f} s  (goal < 3 s: {'met' if p50 < 3 else 'NOT met'})")

        host = base.removeprefix("http://")
        compare(args, runs_dir, host, apps_port, client.get(f"/api/projects/{project_id}/deployment").json()["url"],
                f"v{args.deploys}".encode(), "Flask on waitress (what a Flask deploy runs)")
        dev_server = {"app.py": APP.replace("{version}", "dev"),
                      "codeyard.toml": f'[deploy]\nrun = "python3 -m flask --app app run --port {PORT}"\n'}
        before = set(runs_dir.glob("app-*/app.sock"))
        other = client.post("/api/projects", json={"name": "bench dev server"}).json()["id"]
        for path, text in dev_server.items():
            client.put(f"/api/projects/{other}/files/content/{path}", content=text.encode()).raise_for_status()
        click_to_live(client, base, other, "dev", write=False)
        [socket] = set(runs_dir.glob("app-*/app.sock")) - before
        compare(args, runs_dir, host, apps_port, client.get(f"/api/projects/{other}/deployment").json()["url"], b"dev",
                "Flask's development server (no keep-alive), for comparison", socket)


def compare(args, runs_dir: Path, host: str, apps_port: int, url: str, expected: bytes, label: str,
            socket: Path | None = None) -> None:
    """req/s direct (the instance's socket), through the apps' port and through the IDE's port, alternated
    over rounds; prints the ratios."""
    if socket is None:
        [socket] = runs_dir.glob("app-*/app.sock")
    hostname, port = host.split(":")
    doors = {"direct": (lambda: asyncio.open_unix_connection(str(socket)), "/", "app"),
             "apps port": (lambda: asyncio.open_connection(hostname, apps_port), url, f"{hostname}:{apps_port}"),
             "IDE port": (lambda: asyncio.open_connection(hostname, int(port)), url, host)}
    rates: dict[str, list[float]] = {name: [] for name in doors}
    for _ in range(args.rounds):  # alternated, so a change in the machine's load hits all alike
        for name, (open_connection, path, host_header) in doors.items():
            rates[name].append(asyncio.run(throughput(open_connection, path, host_header, args.connections,
                                                      args.seconds / args.rounds, expected)))
    mean = {name: statistics.mean(values) for name, values in rates.items()}
    print(f"{label}: requests/s with {args.connections} connections: direct to the app {mean['direct']:.0f}")
    for name in ("apps port", "IDE port"):
        ratio = mean[name] / mean["direct"]
        goal = f"goal >= 0.70: {'met' if ratio >= 0.7 else 'NOT met'}; " if name == "apps port" else ""
        print(f"  through the {name}: {mean[name]:.0f}, ratio {ratio:.2f}  ({goal}per round "
              + ", ".join(f"{p / d:.2f}" for d, p in zip(rates["direct"], rates[name])) + ")")


if __name__ == "__main__":
    main()
