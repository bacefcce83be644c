"""An OpenAI-compatible LLM server elsewhere (CODEYARD_LLM_URL, e.g. compose's `llm` service).

When it is set, app replicas load no model: /v1 and /llm/metrics are passed through as they are,
and the assistant sends its completions and chats there. The caller's credentials never leave
this server; the LLM server's key (CODEYARD_LLM_API_KEY) goes instead. Failures to reach it are
503 "unreachable" in OpenAI's error shape, never a 500.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from llm_engine.entrypoints import OpenAIError

STATE_TIMEOUT_S = 3.0
_PASSED_HEADERS = frozenset({"inference-header-content-length"})


class RemoteLLMSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CODEYARD_LLM_", extra="ignore")

    url: str | None = None
    api_key: SecretStr | None = None


@dataclass
class Upstream:
    """An answer of the LLM server being read. Closed before its end, its connection is closed
    (httpx keeps only connections whose answer was read to the end), which the server sees."""

    response: httpx.Response

    async def aclose(self) -> None:
        await self.response.aclose()


async def relay(upstream: Upstream) -> AsyncIterator[bytes]:
    """The upstream body as it arrives; leaving early (the client went away) closes the upstream
    connection, which makes the LLM server abort the request."""
    try:
        async for chunk in upstream.response.aiter_raw():
            yield chunk
    finally:
        await upstream.aclose()


class RemoteLLM:
    """Requests reuse kept-alive connections, one pool per event loop (an httpx client belongs to
    the loop it runs on). A new connection per request cost ~2 ms of set-up before the server saw
    the request (traced on one host, issue 21), on every inline completion the editor asks for."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = httpx.Timeout(timeout, connect=5.0)
        self._model: str | None = None
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = \
            weakref.WeakKeyDictionary()

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            # idle connections go before uvicorn's 5 s keep-alive closes them: one reused in
            # that window would race the server's close
            client = self._clients[loop] = httpx.AsyncClient(
                base_url=self.url, headers=self.headers, timeout=self.timeout,
                limits=httpx.Limits(max_connections=None, keepalive_expiry=4.0))
        return client

    @classmethod
    def from_env(cls) -> RemoteLLM | None:
        settings = RemoteLLMSettings()
        if not settings.url:
            return None
        return cls(settings.url, settings.api_key.get_secret_value() if settings.api_key else None)

    def _refused(self) -> str:
        return f"the LLM server at {self.url} refused this server's key (CODEYARD_LLM_API_KEY)"

    def _unreachable(self, exc: Exception) -> OpenAIError:
        return OpenAIError(503, f"the LLM server at {self.url} is unreachable ({type(exc).__name__})",
                           code="llm_unreachable", retry_after=5)

    async def open(self, method: str, path: str, body: bytes | None = None,
                   headers: dict[str, str] | None = None) -> Upstream:
        """Send a request; the answer streams. Refusals of our key become 503 (a setup problem)."""
        client = self._client()
        try:
            request = client.build_request(method, path, content=body,
                                           headers={"Content-Type": "application/json", **(headers or {})}
                                           if body else None)
            upstream = Upstream(await client.send(request, stream=True))
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if upstream.response.status_code == 401:
            await upstream.aclose()
            raise OpenAIError(503, self._refused(), code="llm_key_refused")
        return upstream

    async def forward(self, request: Request, path: str) -> Response:
        """The caller's request, sent on as it is (body, method), and its answer streamed back
        (with the /v2 binary extension's header both ways)."""
        upstream = await self.open(request.method, path, await request.body() or None,
                                   {k: v for k, v in request.headers.items() if k in _PASSED_HEADERS})
        answer = upstream.response
        headers = {k: v for k, v in answer.headers.items() if k in _PASSED_HEADERS | {"retry-after"}}
        return StreamingResponse(relay(upstream), status_code=answer.status_code, headers=headers,
                                 media_type=answer.headers.get("content-type"))

    async def post_stream(self, path: str, payload: dict[str, Any]) -> Upstream:
        """POST a streaming request; an error answer (before any chunk) raises its OpenAIError."""
        upstream = await self.open("POST", path, json.dumps(payload).encode())
        answer = upstream.response
        if answer.status_code != 200:
            try:
                message = json.loads(await answer.aread())["error"]["message"]
            except (ValueError, KeyError, TypeError, httpx.HTTPError):
                message = f"the LLM server answered {answer.status_code}"
            finally:
                await upstream.aclose()
            if answer.status_code == 404:
                self._model = None  # the server now serves another model: ask its name again
            retry = answer.headers.get("retry-after")
            raise OpenAIError(answer.status_code, message, retry_after=int(retry) if retry and retry.isdigit() else None)
        return upstream

    async def model_name(self) -> str:
        """The name the LLM server serves its model under (asked once)."""
        if self._model is None:
            upstream = await self.open("GET", "/v1/models")
            try:
                self._model = json.loads(await upstream.response.aread())["data"][0]["id"]
            except (ValueError, KeyError, IndexError, TypeError, httpx.HTTPError) as exc:
                raise self._unreachable(exc) from None
            finally:
                await upstream.aclose()
        return self._model

    def state(self) -> tuple[Literal["ready", "loading", "failed"], str]:
        """(state, why), from the LLM server's model list, asked synchronously with a short timeout."""
        try:
            answer = httpx.get(f"{self.url}/v1/models", headers=self.headers, timeout=STATE_TIMEOUT_S)
            if answer.status_code != 200:
                return "failed", self._refused() if answer.status_code == 401 else \
                    f"the LLM server at {self.url} answered {answer.status_code}"
            ready = answer.json()["data"][0].get("ready", True)
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            return "failed", self._unreachable(exc).message
        return ("ready", f"ready on the LLM server at {self.url}") if ready else ("loading", "the model is loading on the LLM server")

