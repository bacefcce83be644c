"""Event-loop CPU per inference request in the standalone server's app: the inference routes answered
ahead of FastAPI's router (`hot_routes.HotRoutes`, the default) against the same app with every
request through FastAPI, alternated round by round in one process.

The app runs on uvloop as uvicorn runs it, driven through ASGI (no sockets), over a stand-in engine
that answers each request with `--tokens` outputs through the same hand-off the engine-core reader
uses (`RequestStreams._deliver`). Requests come in bursts of `--burst` at once, as the overhead
command's burst phase sends them. The figure is the thread's CPU time per request; the ratio is
hot / FastAPI over the rounds' medians. Prints the machine's load: read it before the figures.

    .venv/bin/python benchmarks/llm_api_cpu.py [--rounds 8] [--bursts 40] [--burst 12] [--tokens 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from llm_engine.config import EngineConfig  # noqa: E402
from llm_engine.engine_loop import AddRequest, Command  # noqa: E402
from llm_engine.entrypoints.app import app_for  # noqa: E402
from llm_engine.entrypoints.service import LLMService, ServerOptions  # noqa: E402
from llm_engine.outputs import CompletionOutput, RequestMetrics, RequestOutput  # noqa: E402
from llm_engine.request_streams import RequestStreams  # noqa: E402

MODEL = "stand-in"
KEY = "bench-key"


class StandInEngine(RequestStreams):
    """Answers every request with `tokens` outputs of one token each, from the event loop's next turn."""

    is_ready = True
    tokenizer = None
    image_inputs = None
    max_model_len = 4096

    def __init__(self, tokens: int) -> None:
        super().__init__(max_waiting=1024, on_step=None)
        self.tokens = tokens

    def check_ready(self) -> None:
        pass

    def require_engine(self) -> StandInEngine:
        return self

    def _submit(self, command: Command) -> None:
        if isinstance(command, AddRequest):
            asyncio.get_running_loop().call_soon(self._answer, command)

    def _answer(self, command: AddRequest) -> None:
        with self._lock:
            self._pending_adds -= 1
        metrics = RequestMetrics(arrival_time=command.arrival_time, first_scheduled_time=time.time())
        for i in range(1, self.tokens + 1):
            metrics.first_token_time = metrics.first_token_time or time.time()
            finished = i == self.tokens
            output = CompletionOutput(0, "x" * i, [42] * i, None, None, "length" if finished else None)
            self._deliver([RequestOutput(command.request_id, None, [1, 2, 3], [output], finished, metrics)])


def _requests(tokens: int) -> dict[str, tuple[str, bytes]]:
    return {
        "v1": ("/v1/completions", json.dumps({"model": MODEL, "prompt": "def fib(n):", "max_tokens": tokens,
                                              "stream": True}).encode()),
        "v2": (f"/v2/models/{MODEL}/generate_stream", json.dumps({"text_input": "def fib(n):",
                                                                 "max_tokens": tokens}).encode()),
    }


async def asgi_request(app: Any, method: str, path: str, body: bytes,
                       send: Callable[[dict[str, Any]], Awaitable[None]], key: str | None = KEY,
                       root_path: str = "") -> None:
    """One HTTP request driven through an ASGI app as a server drives it: the whole body at once, and
    no disconnect until the app has answered."""
    auth = ((b"authorization", f"Bearer {key}".encode()),) if key is not None else ()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": root_path, "server": ("testserver", 80), "client": ("127.0.0.1", 40000),
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()), *auth]}
    given = False
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never
        return {"type": "http.disconnect"}

    try:
        await app(scope, receive, send)
    finally:
        never.cancel()


async def _call(app: Any, path: str, body: bytes) -> int:
    """One request through the app; its status (checked: a benchmark of errors would mean nothing)."""
    status = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await asgi_request(app, "POST", path, body, send)
    return status


async def _round(app: Any, path: str, body: bytes, bursts: int, burst: int) -> float:
    """Thread CPU microseconds per request over `bursts` bursts."""
    started = time.thread_time()
    for _ in range(bursts):
        statuses = await asyncio.gather(*(_call(app, path, body) for _ in range(burst)))
        if set(statuses) != {200}:
            raise SystemExit(f"{path}: statuses {statuses}")
    return (time.thread_time() - started) / (bursts * burst) * 1e6


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    apps = {}
    for hot in (True, False):
        service = LLMService(EngineConfig(model=MODEL), MODEL, ServerOptions(api_keys=frozenset({KEY})))
        service.engine = StandInEngine(args.tokens)
        apps["hot" if hot else "fastapi"] = app_for(service, own_service=False, hot_routes=hot)
    requests = _requests(args.tokens)
    for app in apps.values():  # warm-up: imports, FastAPI's middleware stack, pydantic's validators
        for path, body in requests.values():
            await _round(app, path, body, 3, args.burst)
    figures: dict[str, dict[str, list[float]]] = {name: {mode: [] for mode in apps} for name in requests}
    for r in range(args.rounds):
        for name, (path, body) in requests.items():
            modes = list(apps) if r % 2 == 0 else list(reversed(apps))  # neither always first
            for mode in modes:
                figures[name][mode].append(await _round(apps[mode], path, body, args.bursts, args.burst))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--bursts", type=int, default=40)
    parser.add_argument("--burst", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=1)
    args = parser.parse_args()
    import uvloop

    load = os.getloadavg()[0]
    figures = uvloop.run(_main(args))
    print(f"load {load:.2f} -> {os.getloadavg()[0]:.2f}; {args.rounds} rounds of {args.bursts} bursts of "
          f"{args.burst}, {args.tokens} token(s); thread CPU us per request, medians (rounds' range)")
    for name, modes in figures.items():
        hot, fastapi = statistics.median(modes["hot"]), statistics.median(modes["fastapi"])
        print(f"{name}: hot routes {hot:.0f} ({min(modes['hot']):.0f}-{max(modes['hot']):.0f}), "
              f"FastAPI {fastapi:.0f} ({min(modes['fastapi']):.0f}-{max(modes['fastapi']):.0f}), "
              f"ratio {hot / fastapi:.3f}")


if __name__ == "__main__":
    main()
