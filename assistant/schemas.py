"""Request and answer bodies of the assistant API."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, Field, StrictBool, model_validator

Path = Annotated[str, Field(min_length=1, max_length=1024)]
Text = Annotated[str, Field(max_length=200_000)]
Answer = Annotated[str, Field(min_length=1, max_length=20_000)]
MAX_IMAGES = 4  # in one conversation: each answer shows the model all of them again


class OpenFile(BaseModel):
    path: Path
    content: Text


class CompletionCreate(BaseModel):
    """The current file split at the cursor, and the other open tabs."""

    path: Path
    prefix: Text
    suffix: Text = ""
    open_files: Annotated[list[OpenFile], Field(max_length=20)] = []
    indent: str | None = Field(default=None, pattern=r"^( {1,8}|\t)$", description=(
        "The editor's indentation unit (spaces or a tab): the suggestion is indented with it."))


class CompletionPublic(BaseModel):
    text: str = Field(description="Ghost text to insert at the cursor (empty: no suggestion).")


class Continuable(BaseModel):
    continue_answer: Answer | None = Field(default=None, description=(
        "The answer so far, when the length cap cut it short: the reply continues it."))


class FailedRun(BaseModel):
    """A failed run's output and the file it ran."""

    path: Path
    content: Text
    output: Annotated[str, Field(min_length=1, max_length=200_000)]


class ExplainCreate(FailedRun, Continuable):
    """A failed run to explain (or the explanation so far, to continue)."""


class PlainWordsPublic(BaseModel):
    text: str | None = Field(description=(
        "The error in plain words with its line, as the tutorials' grader gives it; null when the output "
        "holds no Python or Node error the IDE knows."))


class ChatMessage(BaseModel):
    role: Literal["user", "assistant"]
    content: Answer
    images: Annotated[list[str], Field(max_length=MAX_IMAGES, description=(
        "The user's pasted or dropped images, as data:image/...;base64, URLs (PNG, JPEG, WebP, GIF), for a "
        "model that sees images (ModelStatus.sees_images)."))] = []

    @model_validator(mode="after")
    def _only_the_user_shows_images(self) -> Self:
        if self.images and self.role != "user":
            raise ValueError("only the user's messages carry images")
        return self


class ChatCreate(Continuable):
    """The conversation so far (ending with the user's question) about the current file."""

    path: Path
    content: Text
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=40)]

    @model_validator(mode="after")
    def _images_fit_a_request(self) -> Self:
        if sum(len(m.images) for m in self.messages) > MAX_IMAGES:
            raise ValueError(f"a conversation shows the model at most {MAX_IMAGES} images")
        return self

    def images(self) -> list[str]:
        return [url for message in self.messages for url in message.images]


class ModelStatus(BaseModel):
    """Where the IDE's LLM stands (the same for every project: one model serves them all)."""

    state: Literal["loading", "ready", "failed", "deferred", "off"] = Field(description=(
        "deferred: it loads on the first request (CODEYARD_LLM_EAGER=0); off: CODEYARD_LLM_MODEL=off."))
    detail: str = Field(description="The state in words, e.g. 'the model is loading (10%, 12 s so far)' or why it failed.")
    progress: int | None = Field(default=None, ge=0, le=100, description="Percent loaded (coarse), for a local model.")
    sees_images: bool | None = Field(default=None, description=(
        "Whether the model takes images in chat (read from its files, known before it loads); null: not known "
        "(a remote LLM server's model)."))


class AssistantPublic(BaseModel):
    enabled: bool = Field(description="The project's switch (owners change it).")
    can_change: bool = Field(description="Whether the caller may change the switch.")
    model: ModelStatus
    max_image_bytes: int = Field(description="The largest image file a chat message may carry.")


class AssistantUpdate(BaseModel):
    enabled: StrictBool  # strict: 0.0 or "no" is a 422, not False
