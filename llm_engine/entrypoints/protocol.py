"""Request schemas of the OpenAI API (plus vLLM's extra sampling fields) and its error object."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from llm_engine.structured_outputs import StructuredOutputsParams


class OpenAIError(Exception):
    """An error answer in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             429: "rate_limit_error", 503: "service_unavailable", 500: "server_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class JSONSchemaFormat(BaseModel):
    name: str = "response"
    description: str | None = None
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_for_json_schema(self) -> Self:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type 'json_schema' (and only then)")
        return self


class _SamplingFields(BaseModel):
    """Fields shared by completions and chat; unknown fields are ignored, as OpenAI clients send many."""

    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    n: Annotated[int, Field(ge=1, le=16)] = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    user: str | None = None
    # vLLM extras
    top_k: int = 0
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0)] = 1.0
    priority: int = 0
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's: {"json" | "regex" | "choice" | "grammar": ...}
    guided_json: dict[str, Any] | str | None = None  # vLLM's older names for the same
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    kv_transfer_params: dict[str, Any] | None = None  # disaggregated serving, between the proxy and its instances

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The one output constraint asked for in any of the accepted shapes (ValueError if several)."""
        asked: list[tuple[str, StructuredOutputsParams]] = []
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            asked.append(("response_format", StructuredOutputsParams(json_object=True)))
        if fmt is not None and fmt.json_schema is not None:
            asked.append(("response_format", StructuredOutputsParams(json=fmt.json_schema.schema_)))
        if self.structured_outputs is not None:
            unknown = sorted(set(self.structured_outputs) - {"json", "regex", "choice", "grammar", "json_object"})
            if unknown:
                raise ValueError(f"structured_outputs: unknown keys {unknown}")
            asked.append(("structured_outputs", StructuredOutputsParams(**self.structured_outputs)))
        guided: dict[str, Any] = {"json": self.guided_json, "regex": self.guided_regex, "choice": self.guided_choice,
                  "grammar": self.guided_grammar}
        for kind, value in guided.items():
            if value is not None:
                asked.append((f"guided_{kind}", StructuredOutputsParams(**{kind: value})))
        if len(asked) > 1:
            raise ValueError(f"{asked[1][0]}: only one output constraint per request "
                             f"({', '.join(name for name, _ in asked)} were given)")
        return asked[0][1] if asked else None

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> Self:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(_SamplingFields):
    prompt: Prompt
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool = False
    suffix: str | None = None
    use_beam_search: bool = False  # vLLM's: beam width best_of (or n), the n best beams returned
    best_of: Annotated[int, Field(ge=1, le=16)] | None = None
    length_penalty: float = 1.0

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of single prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise OpenAIError(400, "prompt must not be empty", param="prompt")
        ids = [x for x in p if isinstance(x, int)]
        if ids:  # a list of token ids is one prompt (the schema allows no mixed lists)
            return [ids]
        return [x for x in p if not isinstance(x, int)]  # texts or token-id lists, one prompt each


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    def image_urls(self) -> list[str]:
        if not isinstance(self.content, list):
            return []
        return [part.image_url.url for part in self.content if isinstance(part, ImagePart)]


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> Self:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        return self


RequestT = TypeVar("RequestT", bound=BaseModel)


def parse_request(model: type[RequestT], body: object) -> RequestT:
    """Validate a JSON body; any problem becomes a 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        raise OpenAIError(400, message, param=param) from None
