"""The LLM's KServe v2 gRPC service inside the IDE server (CODEYARD_LLM_GRPC_PORT; off by default).

The same GRPCInferenceService as `codeyard llm serve --grpc-port`, over the IDE's one LLM (loaded on
first use, as for /v1), on the IDE's event loop and listen host. Callers authenticate as /v1's
token callers do: `authorization: Bearer <personal API token>` metadata (gRPC carries no session
cookie); health (ServerLive/ServerReady) stays open to probes, as /v2/health on the standalone
server. With CODEYARD_LLM_URL the model lives on another server, which serves gRPC itself: the port
is then not opened here, and a warning says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from sqlalchemy.orm import Session, sessionmaker

from assistant.lazy_llm import LazyLLM
from ide_server.services import accounts
from ide_server.wiring import Core

log = logging.getLogger(__name__)
GRACE_S = 1.0  # calls in flight get this long to finish when the server stops


def token_check(sessions: sessionmaker[Session]) -> Callable[[str], Awaitable[bool]]:
    """`Bearer <token>` lets in the owner of a live personal API token (looked up off the event loop)."""
    def known(token: str) -> bool:
        with sessions() as db:
            return accounts.user_for_api_token(db, token) is not None

    async def authorize(authorization: str) -> bool:
        scheme, _, token = authorization.partition(" ")
        return scheme.lower() == "bearer" and bool(token.strip()) and await asyncio.to_thread(known, token.strip())
    return authorize


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@asynccontextmanager
async def serve_grpc(core: Core, llm: LazyLLM) -> AsyncIterator[int | None]:
    """Serve gRPC while the app runs, when a port is set; yields the port it got (None: not served)."""
    settings = core.settings
    port = settings.llm_grpc_port
    if port is None:
        yield None
        return
    if llm.remote is not None:
        log.warning("CODEYARD_LLM_GRPC_PORT is ignored with CODEYARD_LLM_URL: serve gRPC from that LLM server "
                    "(codeyard llm serve --grpc-port)")
        yield None
        return
    # grpc, tritonclient and numpy come with the [llm] extra: loaded only when the port is served here
    from llm_engine.entrypoints import start_grpc_server

    server, bound = await start_grpc_server(llm.get, token_check(core.sessions), _address(settings.host, port))
    log.info("LLM gRPC (KServe v2) on %s", _address(settings.host, bound))
    try:
        yield bound
    finally:
        await server.stop(GRACE_S)
