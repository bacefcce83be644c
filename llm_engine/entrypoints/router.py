"""Data-parallel replicas behind one OpenAI endpoint (`codeyard llm serve --data-parallel-size N`).

Each replica is a whole `codeyard llm serve` with its own engine and prefix cache. The router
sends a request to the replica that most likely holds its prompt's prefix: it remembers, per
replica, the chained hashes of the leading 64-character chunks of the prompts it sent there (a
bounded LRU, like SGLang's cache-aware router keeps an approximate radix tree) and picks the one
matching the most leading chunks; with no match it takes the replica with the fewest requests in
flight. A replica that cannot be reached is left out for a while and the request goes to the next
one, so a dead replica costs its own in-flight requests only: a stream it was sending ends with an
error event (`replica_failed`) and it is left out too.
"""

from __future__ import annotations

import functools
import json
import ssl
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from llm_engine.entrypoints.api import install
from llm_engine.entrypoints.app import check_bearer
from llm_engine.entrypoints.protocol import OpenAIError
from llm_engine.entrypoints.serving import sse

CHUNK_CHARS = 64
REPLICA_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
DEAD_FOR_S = 10.0


def routing_key(payload: dict[str, Any]) -> str:
    """The text whose prefix decides the replica: the prompt, or the chat messages in order."""
    if "messages" in payload:
        return json.dumps(payload["messages"], sort_keys=True)
    return json.dumps(payload.get("prompt", ""))[1:]  # a string's quote (or a list's bracket) dropped


def chunk_hashes(key: str) -> list[int]:
    hashes, parent = [], None
    for start in range(0, len(key) - CHUNK_CHARS + 1, CHUNK_CHARS):
        parent = hash((parent, key[start:start + CHUNK_CHARS]))
        hashes.append(parent)
    return hashes


class PrefixRouter:
    """Chooses a replica per request ("prefix": cache-aware, or "round_robin", the baseline)."""

    def __init__(self, num_replicas: int, policy: str = "prefix", max_chunks: int = 200_000) -> None:
        if policy not in ("prefix", "round_robin"):
            raise ValueError(f"policy: must be 'prefix' or 'round_robin', got {policy!r}")
        self.policy = policy
        self.max_chunks = max_chunks
        self.seen: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]
        self.in_flight = [0] * num_replicas
        self.dead_until = [0.0] * num_replicas
        self._next = 0

    def alive(self) -> list[int]:
        now = time.monotonic()
        return [i for i, until in enumerate(self.dead_until) if until <= now]

    def choose(self, key: str, exclude: set[int]) -> int | None:
        candidates = [i for i in self.alive() if i not in exclude]
        if not candidates:
            return None
        if self.policy == "round_robin":
            self._next += 1
            return candidates[self._next % len(candidates)]
        hashes = chunk_hashes(key)
        matched = {i: self._matched(i, hashes) for i in candidates}
        best = max(matched.values())
        pool = [i for i in candidates if matched[i] == best] if best else candidates
        return min(pool, key=lambda i: (self.in_flight[i], len(self.seen[i]), i))  # then the emptier cache

    def _matched(self, replica: int, hashes: list[int]) -> int:
        count = 0
        for h in hashes:
            if h not in self.seen[replica]:
                break
            count += 1
        return count

    def record(self, replica: int, key: str) -> None:
        seen = self.seen[replica]
        for h in chunk_hashes(key):
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self.max_chunks:
            seen.popitem(last=False)

    def mark_dead(self, replica: int) -> None:
        self.dead_until[replica] = time.monotonic() + DEAD_FOR_S
        self.seen[replica].clear()  # a restarted replica has an empty cache


class Unreachable(Exception):
    """The replica did not answer (connection refused or reset): route the request elsewhere."""


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every upstream client: httpx builds one per client otherwise, reading the
    CA bundle (~30 ms of CPU), and a request opens a client per upstream (two when split), so the
    proxy spent a fifth of a core on it at 3.5 requests a second, beside the instances' cores."""
    return httpx.create_ssl_context()


async def open_upstream(url: str, key: str | None, method: str, path: str, body: bytes | None
                        ) -> tuple[httpx.AsyncClient, httpx.Response]:
    """Send a request to a replica with its key; the answer streams (a client per request:
    requests stream for seconds to minutes and a client is never shared across event loops)."""
    client = httpx.AsyncClient(base_url=url, timeout=REPLICA_TIMEOUT, verify=tls_context(),
                               headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        request = client.build_request(method, path, content=body,
                                       headers={"Content-Type": "application/json"} if body else None)
        return client, await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        await client.aclose()
        raise Unreachable(f"{url}: {type(exc).__name__}") from None


async def relay_events(answer: httpx.Response, failed: Callable[[httpx.HTTPError], OpenAIError]) -> AsyncIterator[bytes]:
    """An upstream SSE stream as whole events, so that when the upstream fails mid-stream the
    stream can end with an error event of its own (`failed` says which)."""
    pending = b""
    try:
        async for chunk in answer.aiter_raw():
            pending += chunk
            end = pending.rfind(b"\n\n") + 2
            if end > 1:
                yield pending[:end]
                pending = pending[end:]
    except httpx.HTTPError as exc:
        yield sse(failed(exc).body()) + sse("[DONE]")


Route = Callable[[bytes, dict[str, Any], str], Awaitable[Response]]  # (body, its JSON object, path) -> answer


def openai_front(title: str, api_keys: frozenset[str], route: Route) -> tuple[FastAPI, list[Any]]:
    """An app whose /v1/completions and /v1/chat/completions check the key and the body (a JSON
    object, else 400) and hand them to `route`, and the key check for the routes the router and
    the disaggregated proxy add."""

    def guard(request: Request) -> None:
        check_bearer(request, api_keys)

    async def parsed(request: Request, path: str) -> Response:
        body = await request.body()
        try:
            payload = json.loads(body)
        except ValueError:
            raise OpenAIError(400, "the body is not JSON") from None
        if not isinstance(payload, dict):
            raise OpenAIError(400, "the body must be a JSON object")
        return await route(body, payload, path)

    app = FastAPI(title=title)
    install(app)
    dependencies = [Depends(guard)]

    @app.post("/v1/completions", dependencies=dependencies)
    async def completions(request: Request) -> Response:
        return await parsed(request, "/v1/completions")

    @app.post("/v1/chat/completions", dependencies=dependencies)
    async def chat(request: Request) -> Response:
        return await parsed(request, "/v1/chat/completions")

    return app, dependencies


def create_router_app(replica_urls: list[str], api_keys: frozenset[str] = frozenset(),
                      replica_key: str | None = None, policy: str = "prefix") -> FastAPI:
    router = PrefixRouter(len(replica_urls), policy)

    def failed(replica: int, exc: httpx.HTTPError) -> OpenAIError:
        router.mark_dead(replica)
        return OpenAIError(502, f"replica {replica + 1} failed during this request ({type(exc).__name__}); the "
                                "answer is incomplete", code="replica_failed")

    async def relay(client: httpx.AsyncClient, answer: httpx.Response, replica: int | None) -> AsyncIterator[bytes]:
        """The replica's body as it arrives; leaving early closes its connection (it aborts)."""
        try:
            if replica is not None and answer.headers.get("content-type", "").startswith("text/event-stream"):
                async for event in relay_events(answer, lambda exc: failed(replica, exc)):
                    yield event
            else:
                async for chunk in answer.aiter_raw():
                    yield chunk
        finally:
            if replica is not None:
                router.in_flight[replica] -= 1
            await answer.aclose()
            await client.aclose()

    async def forward(method: str, path: str, body: bytes | None, key: str) -> Response:
        """To the best replica that answers; replicas that do not are left out for a while."""
        tried: set[int] = set()
        while (replica := router.choose(key, tried)) is not None:
            tried.add(replica)
            try:
                client, answer = await open_upstream(replica_urls[replica], replica_key, method, path, body)
            except Unreachable:
                router.mark_dead(replica)
                continue
            if body is not None:
                router.record(replica, key)
                router.in_flight[replica] += 1
            headers = {k: v for k, v in answer.headers.items() if k == "retry-after"}
            return StreamingResponse(relay(client, answer, replica if body is not None else None),
                                     status_code=answer.status_code, headers=headers,
                                     media_type=answer.headers.get("content-type"))
        raise OpenAIError(503, "no replica is reachable", code="llm_unreachable", retry_after=5)

    async def route(body: bytes, payload: dict[str, Any], path: str) -> Response:
        return await forward("POST", path, body, routing_key(payload))

    app, dependencies = openai_front("Codeyard LLM router", api_keys, route)
    app.state.router = router

    @app.get("/v1/models", dependencies=dependencies)
    async def models() -> Response:
        return await forward("GET", "/v1/models", None, "")

    @app.get("/health")
    def health() -> dict[str, Any]:
        """200 while some replica is thought alive."""
        if not router.alive():
            raise OpenAIError(503, "no replica is reachable", code="llm_unreachable")
        return {"status": "ok", "replicas": len(replica_urls), "alive": len(router.alive())}

    return app
