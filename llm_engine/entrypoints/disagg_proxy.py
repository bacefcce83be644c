"""The proxy of disaggregated serving (`codeyard llm serve --disaggregated`).

Each OpenAI request runs in two parts. The prefill instance runs it with max_tokens=1 and keeps the
prompt's KV (`kv_transfer_params: {"do_remote_decode": true}`). The decode instance then gets the
client's own request plus the prefill instance's `kv_transfer_params`, pulls that KV, computes
only the last prompt token and streams the answer, which the proxy relays as it comes. Long
prompts then cost the prefill instance's time, not the decode instance's running streams.

With `max_local_prefill_length` N > 0, a prompt of at most N tokens goes whole to the decode
instance, which prefills it itself (NVIDIA Dynamo's conditional disaggregation, same name): a
short prefill costs the decode instance little, and on the prefill instance short prompts queue
behind long ones, then reach the decode instance together and swell its batch. The proxy has no
tokenizer, so a text prompt counts as many tokens as its UTF-8 bytes (a byte-level BPE token
covers at least one byte) and a chat as the bytes of its messages as JSON (the template's tokens
too): an upper bound, so only prompts that are surely short stay local.

The prefill instance takes its queue shortest prompt first: the proxy sets each split request's
`priority` there to its prompt's length (the bound above), and the launchers run that instance with
the priority policy. First come, first served, a short prompt that arrives during a burst of long
ones waits for all of them (seconds), and the short prompts held up together then reach the decode
instance together and swell its batch, which is what its TPOT is made of. Now a short prompt waits
at most for the one long prompt already being computed. A client's own `priority` applies on the
decode instance.

Requests that cannot be split go whole to the prefill instance: several prompts, echo, prompt
logprobs, beam search, max_tokens=1. So do all requests while the decode instance cannot be
reached; it is tried again after DEAD_FOR_S. A decode instance that dies mid-stream ends that
stream with an error event. Its KV went with the process, and the prefill instance released
its blocks once they were pulled.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.responses import Response, StreamingResponse

from llm_engine.entrypoints.protocol import OpenAIError
from llm_engine.entrypoints.router import DEAD_FOR_S, Unreachable, open_upstream, openai_front, relay_events


def splittable(payload: dict[str, Any]) -> bool:
    """Whether the request's prompt KV can be computed on one instance and used on the other."""
    if any(payload.get(name) for name in ("echo", "prompt_logprobs", "use_beam_search")):
        return False
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) != 1:
        return False
    return (payload.get("max_completion_tokens") or payload.get("max_tokens")) != 1


def prompt_tokens_bound(payload: dict[str, Any]) -> int:
    """At least the request's prompt tokens: exact for token ids, else UTF-8 bytes (see above)."""
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
        return len(prompt)
    if isinstance(prompt, str):
        return len(prompt.encode())
    return len(json.dumps(payload.get("messages"), ensure_ascii=False).encode())


def prefill_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The request as the prefill instance runs it: one token, one sample, not streamed, its KV kept,
    shortest prompt first (see above)."""
    body = {k: v for k, v in payload.items()
            if k not in ("stream", "stream_options", "max_completion_tokens", "n", "best_of", "logprobs",
                         "top_logprobs")}
    return {**body, "max_tokens": 1, "min_tokens": 0, "priority": prompt_tokens_bound(payload),
            "kv_transfer_params": {"do_remote_decode": True}}


class _Decode:
    """Whether the decode instance is thought alive (a failed one is tried again after DEAD_FOR_S)."""

    def __init__(self) -> None:
        self.dead_until = 0.0

    @property
    def alive(self) -> bool:
        return self.dead_until <= time.monotonic()

    def mark_dead(self) -> None:
        self.dead_until = time.monotonic() + DEAD_FOR_S


def decode_failed(exc: Exception) -> OpenAIError:
    return OpenAIError(502, f"the decode instance failed during this request ({type(exc).__name__}); "
                            "the answer is incomplete", code="decode_instance_failed")


async def read_whole(client: httpx.AsyncClient, answer: httpx.Response) -> bytes:
    try:
        return await answer.aread()
    finally:
        await answer.aclose()
        await client.aclose()


def create_disagg_app(prefill_url: str, decode_url: str, api_keys: frozenset[str] = frozenset(),
                      instance_key: str | None = None, max_local_prefill_length: int = 0) -> FastAPI:
    decode = _Decode()

    async def open_at(url: str, path: str, payload: dict[str, Any]) -> tuple[httpx.AsyncClient, httpx.Response]:
        return await open_upstream(url, instance_key, "POST", path, json.dumps(payload).encode())

    async def relay(client: httpx.AsyncClient, answer: httpx.Response, from_decode: bool) -> AsyncIterator[bytes]:
        """The instance's SSE events as they come, whole events only, so that a failure can end the
        stream with an error event of its own."""
        def failed(exc: httpx.HTTPError) -> OpenAIError:
            if from_decode:
                decode.mark_dead()
            return decode_failed(exc)

        try:
            async for event in relay_events(answer, failed):
                yield event
        finally:
            await answer.aclose()
            await client.aclose()

    async def answer_of(client: httpx.AsyncClient, answer: httpx.Response, stream: bool, from_decode: bool) -> Response:
        if stream and answer.status_code == 200:
            return StreamingResponse(relay(client, answer, from_decode), media_type=answer.headers.get("content-type"))
        try:
            content = await read_whole(client, answer)
        except httpx.HTTPError as exc:
            if from_decode:
                decode.mark_dead()
            raise decode_failed(exc) from None
        headers = {k: v for k, v in answer.headers.items() if k == "retry-after"}
        return Response(content, answer.status_code, headers, media_type=answer.headers.get("content-type"))

    async def whole_on_prefill(path: str, payload: dict[str, Any]) -> Response:
        try:
            client, answer = await open_at(prefill_url, path, payload)
        except Unreachable:
            raise OpenAIError(503, "the prefill instance is unreachable", code="llm_unreachable", retry_after=5) from None
        return await answer_of(client, answer, bool(payload.get("stream")), from_decode=False)

    async def route(_body: bytes, payload: dict[str, Any], path: str) -> Response:
        payload.pop("kv_transfer_params", None)  # set by the proxy only
        if not splittable(payload) or not decode.alive:
            return await whole_on_prefill(path, payload)
        if max_local_prefill_length and prompt_tokens_bound(payload) <= max_local_prefill_length:
            return await on_decode(path, payload, payload)
        try:
            client, answer = await open_at(prefill_url, path, prefill_payload(payload))
        except Unreachable:
            raise OpenAIError(503, "the prefill instance is unreachable", code="llm_unreachable", retry_after=5) from None
        try:
            content = await read_whole(client, answer)
        except httpx.HTTPError as exc:
            raise OpenAIError(502, f"the prefill instance failed ({type(exc).__name__})", code="prefill_failed") from None
        if answer.status_code != 200:  # the request's own errors (400s, 429), as the instance said them
            return Response(content, answer.status_code, media_type=answer.headers.get("content-type"))
        transfer = json.loads(content).get("kv_transfer_params")
        if transfer is None:
            raise OpenAIError(502, "the prefill instance kept no KV for this request", code="prefill_failed")
        return await on_decode(path, {**payload, "kv_transfer_params": transfer}, payload)

    async def on_decode(path: str, payload: dict[str, Any], original: dict[str, Any]) -> Response:
        """The request on the decode instance, or whole on the prefill instance (`original`) if that
        one cannot be reached (a prefill instance's hold then expires on its own)."""
        try:
            client, answer = await open_at(decode_url, path, payload)
        except Unreachable:
            decode.mark_dead()
            return await whole_on_prefill(path, original)
        return await answer_of(client, answer, bool(payload.get("stream")), from_decode=True)

    app, dependencies = openai_front("Codeyard LLM disaggregated proxy", api_keys, route)

    @app.get("/v1/models", dependencies=dependencies)
    async def models() -> Response:
        try:
            client, answer = await open_upstream(prefill_url, instance_key, "GET", "/v1/models", None)
        except Unreachable:
            raise OpenAIError(503, "the prefill instance is unreachable", code="llm_unreachable") from None
        return Response(await read_whole(client, answer), answer.status_code, media_type="application/json")

    @app.get("/health")
    def health() -> dict[str, Any]:
        """200 while the proxy runs; says whether requests are split or run whole on the prefill instance."""
        return {"status": "ok", "decode_instance": "alive" if decode.alive else "unreachable"}

    return app
