"""The assistant API, for editors of a project (its owner changes the switch; every member reads it).

    GET     /api/assistant/model            the model's status, for any signed-in user (never loads it)
    GET/PUT /api/projects/{id}/assistant   the switch, and the model's status
    POST    .../assistant/complete          ghost text for the cursor (JSON)
    POST    .../assistant/plain-words       a failed run's error in plain words, as the grader gives it (JSON)
    POST    .../assistant/explain           why a run failed (OpenAI chat chunks over SSE)
    POST    .../assistant/chat              an answer about the current file (SSE, the same chunks)

The model starts loading when the server starts (or, with CODEYARD_LLM_EAGER=0, on the first
generating call); until it is ready, generating calls answer 503 "model is loading" with
Retry-After. A switched-off project answers 403; a user over the rate, 429 with Retry-After.
Closing the connection aborts the generation. Viewers get none of it: they watch a project but
don't work in it (they can't run it either), and POSTs on a project need an editor.
"""

from __future__ import annotations

from typing import Annotated, Any

import redis
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from assistant.lazy_llm import LazyLLM
from assistant.ratelimit import SharedRateLimiter
from assistant.schemas import (
    AssistantPublic,
    AssistantUpdate,
    ChatCreate,
    CompletionCreate,
    CompletionPublic,
    ExplainCreate,
    FailedRun,
    ModelStatus,
    PlainWordsPublic,
)
from assistant.service import ANSWER_COST, Assistant, AssistantConfig, Model
from ide_server.components import Component
from ide_server.deps import CurrentUser, DbSession, ProjectEditor, ProjectMember, ProjectOwner
from ide_server.error_handlers import ERROR_RESPONSES
from ide_server.services.projects import ProjectAccess
from ide_server.wiring import Builders, Core, required, services_of
from llm_engine.entrypoints import answer, unless_disconnected

STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {200: {"description": "OpenAI chat completion chunks, then [DONE]",
                                                 "content": {"text/event-stream": {}}}}
router = APIRouter(tags=["assistant"], responses=ERROR_RESPONSES)
project_router = APIRouter(prefix="/api/projects/{project_id}/assistant",
                           responses={503: {"description": "The model is loading or unavailable"}})


async def _assistant(conn: HTTPConnection) -> Assistant:
    return required(services_of(conn.app.state).assistant, "assistant")


AssistantDep = Annotated[Assistant, Depends(_assistant)]


async def _admit(assistant: Assistant, db: DbSession, ctx: ProjectAccess, cost: float) -> Model:
    """Check the switch, the model and the rate; then give the request's DB connection back to the
    pool, since generating (and streaming) takes seconds."""
    try:
        return await run_in_threadpool(assistant.admit, db, ctx, cost)
    finally:
        db.close()


@router.get("/api/assistant/model")
def model_status(_user: CurrentUser, assistant: AssistantDep) -> ModelStatus:
    """Whether the model is loading (and how far), ready, failed (and why), deferred or off."""
    return assistant.llm.status()


@project_router.get("")
def get_assistant(ctx: ProjectMember, db: DbSession, assistant: AssistantDep) -> AssistantPublic:
    """Whether the assistant is on for this project, and the model's status."""
    return assistant.describe(db, ctx)


@project_router.put("")
def update_assistant(body: AssistantUpdate, ctx: ProjectOwner, db: DbSession, assistant: AssistantDep) -> AssistantPublic:
    """Switch the assistant on or off for everyone in the project (owners)."""
    assistant.set_enabled(db, ctx.project.id, body.enabled)
    return assistant.describe(db, ctx)


@project_router.post("/complete", response_model=CompletionPublic)
async def complete(body: CompletionCreate, ctx: ProjectEditor, db: DbSession, request: Request,
                   assistant: AssistantDep) -> CompletionPublic | Response:
    """Ghost text to show at the cursor: the rest of the line (or the next line)."""
    model = await _admit(assistant, db, ctx, 1)
    result = await unless_disconnected(request, assistant.complete(model, body))
    return result if isinstance(result, Response) else CompletionPublic(text=result)


@project_router.post("/plain-words")
async def plain_words(body: FailedRun, ctx: ProjectEditor, db: DbSession, assistant: AssistantDep) -> PlainWordsPublic:
    """A failed run's error in plain words with its line (no model: at once, and right when the model is not)."""
    return PlainWordsPublic(text=await run_in_threadpool(assistant.plain_words, db, ctx, body))


@project_router.post("/explain", responses=STREAM_RESPONSES, response_class=Response)
async def explain(body: ExplainCreate, ctx: ProjectEditor, db: DbSession, request: Request,
                  assistant: AssistantDep) -> Response:
    """A streamed explanation of a failed run's output, given the file it ran."""
    model = await _admit(assistant, db, ctx, ANSWER_COST)
    return answer(await unless_disconnected(request, assistant.explain(model, body)))


@project_router.post("/chat", responses=STREAM_RESPONSES, response_class=Response)
async def chat(body: ChatCreate, ctx: ProjectEditor, db: DbSession, request: Request,
               assistant: AssistantDep) -> Response:
    """A streamed answer to the conversation's last question, about the current file (and the images it
    shows, for a model that sees images: 400 for a text-only one)."""
    await run_in_threadpool(assistant.check_images, body)
    model = await _admit(assistant, db, ctx, ANSWER_COST)
    return answer(await unless_disconnected(request, assistant.chat(model, body)))


router.include_router(project_router)


def make_assistant(core: Core, *, llm: LazyLLM) -> Assistant:
    config = AssistantConfig()
    redis_url = core.settings.redis_url  # several servers: one rate per user across them
    limiter = SharedRateLimiter(redis.Redis.from_url(redis_url), config.rate_per_minute, config.burst) if redis_url else None
    return Assistant(llm, config, limiter)


component = Component(name="assistant", router=router, builds=Builders(assistant=make_assistant))
