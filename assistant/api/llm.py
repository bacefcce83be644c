"""The LLM as an IDE-server component: /v1 (OpenAI API), /v2 (KServe v2) and /llm/metrics for signed-in users.

The model (CODEYARD_LLM_MODEL: a local folder or .gguf; unset means the built-in SmolLM2; "off"
disables it) starts loading in the background when the server starts (CODEYARD_LLM_EAGER=0: on
first use instead), so the IDE starts at once and stays usable: until the model is ready /v1
answers 503 "model is loading", and GET /api/assistant/model says how far it is. Callers sign in as for /api: a
session cookie (with the CSRF header on POST) or a personal API token as Bearer. With
CODEYARD_LLM_URL set (app replicas in compose), no model loads here: /v1, /v2 and /llm/metrics are
forwarded to that LLM server (see remote.py). CODEYARD_LLM_GRPC_PORT adds KServe v2 gRPC (llm_grpc.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from assistant.lazy_llm import LazyLLM
from assistant.llm_grpc import serve_grpc
from assistant.remote import RemoteLLM
from ide_server.components import Component
from ide_server.deps import require_user
from ide_server.models import User
from ide_server.wiring import Builders, Core, Model, required, services_of
from llm_engine.entrypoints import LLMService, build_kserve_router, build_openai_router, install_error_handler

METRICS_PATH = "/llm/metrics"


def llm_of(app: FastAPI) -> LazyLLM:
    return required(services_of(app.state).llm, "llm")


def _service(request: Request) -> LLMService:
    return llm_of(request.app).get()


class Forwarded(Exception):
    """Carries the LLM server's answer out of the dependency that forwarded the request."""

    def __init__(self, response: Response) -> None:
        super().__init__("forwarded")
        self.response = response


async def _signed_in_here_or_forwarded(request: Request, _user: Annotated[User, Depends(require_user)]) -> None:
    """Signed-in callers only; with a remote LLM server, their request goes there (this route's
    own handler never runs)."""
    remote = llm_of(request.app).remote
    if remote is not None:
        path = "/metrics" if request.url.path == METRICS_PATH else request.url.path
        raise Forwarded(await remote.forward(request, path))


async def _forwarded_answer(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Forwarded)
    return exc.response


def _setup(app: FastAPI) -> None:
    install_error_handler(app)
    app.add_exception_handler(Forwarded, _forwarded_answer)


@asynccontextmanager
async def open_model(core: Core) -> AsyncIterator[Model]:
    """The IDE's model, loading from the start unless CODEYARD_LLM_EAGER=0, and its gRPC service when asked."""
    llm = LazyLLM(core.settings.llm_model, RemoteLLM.from_env())
    if core.settings.llm_eager:
        llm.load()  # returns at once: the engine loads in a thread of its own
    try:
        async with serve_grpc(core, llm) as grpc_port:  # stopped before the model it serves
            yield Model(llm, grpc_port)
    finally:
        llm.stop()


_guard = Depends(_signed_in_here_or_forwarded)
router = build_openai_router(_service, _guard, metrics_path=METRICS_PATH)
router.include_router(build_kserve_router(_service, _guard))
component = Component(name="llm", router=router, setup=_setup, builds=Builders(llm=open_model))
