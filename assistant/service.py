"""Assistant: the rules (project switch, rate limit, model readiness) and the calls to the LLM.

Completions stop as soon as the ghost text's line is complete; explanations and chat stream the
OpenAI chat chunks (`data: {...choices[0].delta.content...}` ... `data: [DONE]`) that /v1
clients parse, from the model in this process or from the LLM server (see backends.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.orm import Session

from assistant import prompts
from assistant.backends import LocalModel, RemoteModel
from assistant.lazy_llm import LazyLLM
from assistant.models import AssistantSetting
from assistant.ratelimit import RateLimiter, SharedRateLimiter
from assistant.schemas import AssistantPublic, ChatCreate, CompletionCreate, ExplainCreate, FailedRun
from ide_server.errors import DomainError, InvalidInput, PermissionDenied, Throttled
from ide_server.models import Role, utcnow
from ide_server.services.projects import ProjectAccess
from llm_engine.entrypoints import OpenAIError
from llm_engine.entrypoints.chat_images import decode_data_url
from llm_engine.multimodal.limits import ImageLimits
from sandbox import ErrorInfo, error_from_output, explain_error

Model = LocalModel | RemoteModel
ANSWER_COST = 5  # an explanation or a chat answer weighs as much as this many completions


class AssistantConfig(BaseSettings):
    """CODEYARD_ASSISTANT_* settings: the per-user rate limit and how long answers may be."""

    model_config = SettingsConfigDict(env_prefix="CODEYARD_ASSISTANT_", extra="ignore")

    rate_per_minute: float = Field(default=60.0, gt=0, description="Completions a minute per user (answers cost 5).")
    burst: int = Field(default=20, ge=ANSWER_COST, description="Calls a user may make at once before the rate applies.")
    completion_tokens: int = Field(default=16, ge=1, le=256)
    answer_tokens: int = Field(default=256, ge=1, le=2048)
    image_bytes: int = Field(default=5 * 1024 * 1024, ge=1024, le=ImageLimits().max_bytes,
                             description="The largest image file a chat question may show (a screenshot's size).")


class AssistantOff(PermissionDenied):
    """The project's owner switched the assistant off."""


class ModelUnavailable(DomainError):
    """The model is loading (or cannot load); the client retries after a while."""

    status_code = 503

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


def _domain_error(exc: OpenAIError) -> DomainError:
    if exc.status == 429:
        return Throttled(exc.message, exc.retry_after or 1)
    if exc.status == 503:
        return ModelUnavailable(exc.message)
    if exc.status == 400:
        return InvalidInput(exc.message)
    error = DomainError(exc.message)
    error.status_code = exc.status
    return error


class Assistant:
    def __init__(self, llm: LazyLLM, config: AssistantConfig, limiter: RateLimiter | SharedRateLimiter | None = None
                 ) -> None:
        self.llm = llm
        self.config = config
        self.limiter = limiter or RateLimiter(config.rate_per_minute, config.burst)

    # ----- the per-project switch -----

    def is_enabled(self, db: Session, project_id: str) -> bool:
        row = db.get(AssistantSetting, project_id)
        return row is None or row.enabled

    def require_enabled(self, db: Session, project_id: str) -> None:
        if not self.is_enabled(db, project_id):
            raise AssistantOff("the assistant is switched off for this project by its owner")

    def set_enabled(self, db: Session, project_id: str, enabled: bool) -> None:
        row = db.get(AssistantSetting, project_id) or AssistantSetting(project_id=project_id)
        row.enabled, row.updated_at = enabled, utcnow()
        db.add(row)
        db.commit()

    def describe(self, db: Session, access: ProjectAccess) -> AssistantPublic:
        return AssistantPublic(enabled=self.is_enabled(db, access.project.id), can_change=access.role == Role.owner,
                               model=self.llm.status(), max_image_bytes=self.config.image_bytes)

    def check_images(self, body: ChatCreate) -> None:
        """A question's images, before the model is asked (or loads): each a data: URL of an image file within
        the size limit, and a model that sees images; else InvalidInput (400) saying which."""
        images = body.images()
        if images and self.llm.sees_images is False:
            raise InvalidInput(f"the assistant's model ({self.llm.name}) is text-only: it cannot see images. "
                               "Describe the picture in words, or paste the text of the error.")
        limits = ImageLimits(max_bytes=self.config.image_bytes)
        for url in images:
            try:
                decode_data_url(url, limits)
            except OpenAIError as exc:
                raise InvalidInput(exc.message.replace("image_url:", "images:", 1)) from None

    # ----- admission -----

    def admit(self, db: Session, access: ProjectAccess, cost: float) -> Model:
        """The model for one call, or AssistantOff (403), ModelUnavailable (503; a deferred local
        model starts loading), Throttled (429). Loading answers don't use up the caller's rate."""
        self.require_enabled(db, access.project.id)
        model: Model
        if self.llm.remote is not None:
            model = RemoteModel(self.llm.remote)
        else:
            try:
                service = self.llm.get()
                service.require_ready()
            except OpenAIError as exc:
                raise _domain_error(exc) from None
            model = LocalModel(service)
        assert access.user is not None
        wait = self.limiter.take(access.user.id, cost)
        if wait:
            raise Throttled(f"too many assistant requests; try again in {wait} s", wait)
        return model

    # ----- the calls -----

    async def complete(self, model: Model, body: CompletionCreate) -> str:
        """Ghost text for the cursor: greedy, a few tokens, stopped once its line is complete, indented as the
        editor indents (the model sees the code as it reads it best)."""
        unit = body.indent or prompts.MODEL_INDENT

        def for_model(text: str) -> str:
            return prompts.reindent(text, unit, prompts.MODEL_INDENT) if unit != prompts.MODEL_INDENT else text

        prompt = prompts.completion_prompt(body.path, for_model(body.prefix),
                                           [(f.path, for_model(f.content)) for f in body.open_files])
        try:
            text = await model.complete(prompt, self.config.completion_tokens, prompts.line_is_complete)
        except OpenAIError as exc:
            raise _domain_error(exc) from None
        ghost = prompts.ghost_text(text, body.suffix.split("\n", 1)[0])
        if unit == prompts.MODEL_INDENT:
            return ghost
        in_indentation = not body.prefix.rsplit("\n", 1)[-1].strip()  # the cursor has only whitespace before it
        return prompts.reindent(ghost, prompts.MODEL_INDENT, unit, first_line=in_indentation)

    async def explain(self, model: Model, body: ExplainCreate) -> AsyncIterator[bytes]:
        return await self._answer(model, prompts.explain_messages(body.path, body.content, body.output,
                                                                  failing_line(body)),
                                  body.continue_answer)

    def plain_words(self, db: Session, access: ProjectAccess, body: FailedRun) -> str | None:
        """The error in plain words, as the tutorials' grader explains it: right even when the small
        model's own text is not, and there at once, while the model loads too."""
        self.require_enabled(db, access.project.id)
        error = _run_error(body)
        return explain_error(error, _language(body.path), {body.path: body.content}) if error else None

    async def chat(self, model: Model, body: ChatCreate) -> AsyncIterator[bytes]:
        conversation = [(m.role, m.content, m.images) for m in body.messages]
        return await self._answer(model, prompts.chat_messages(body.path, body.content, conversation),
                                  body.continue_answer)

    async def _answer(self, model: Model, messages: list[prompts.ChatMessage], continue_answer: str | None
                      ) -> AsyncIterator[bytes]:
        """The streamed answer (or, given the answer so far that the length cap cut, the rest of it)."""
        if continue_answer is not None:
            messages = prompts.continued(messages, continue_answer)
        try:
            return await model.chat(messages, self.config.answer_tokens)
        except OpenAIError as exc:
            raise _domain_error(exc) from None


def _language(path: str) -> str:
    return "javascript" if path.endswith((".js", ".mjs", ".cjs")) else "python"


def _run_error(run: FailedRun) -> ErrorInfo | None:
    """The error a failed run's output reports, located in the file it ran where it can be."""
    return error_from_output(run.output, _language(run.path), {run.path: run.content})


def failing_line(run: FailedRun) -> tuple[int, str] | None:
    """The line of the student's file that the run's error points at, when its output names one."""
    error = _run_error(run)
    return (error.line, error.code) if error and error.in_learner_file and error.line and error.code else None
