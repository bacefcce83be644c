"""Where the assistant's model runs: in this process (LocalModel) or on an LLM server (RemoteModel).

Both give the same two calls and raise OpenAIError for every failure (loading, full, bad input,
unreachable), which the Assistant maps to the IDE's errors in one place. Chats stream OpenAI chat
chunks in both cases, so the browser reads one format.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from assistant.prompts import ChatMessage
from assistant.remote import RemoteLLM, relay
from llm_engine import EngineNotReady, EngineOverloaded, SamplingParams
from llm_engine.entrypoints import ChatCompletionRequest, LLMService, OpenAIError, ServingChat, as_openai_error

# Answers: a little randomness, and a push away from the loops small models fall into.
ANSWER_SAMPLING = {"temperature": 0.2, "repetition_penalty": 1.1}

Done = Callable[[str], bool]


def chat_payload(model: str, messages: list[ChatMessage], max_tokens: int) -> dict[str, Any]:
    return {"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens, **ANSWER_SAMPLING}


class LocalModel:
    def __init__(self, service: LLMService) -> None:
        self.service = service

    async def complete(self, prompt: str, max_tokens: int, done: Done) -> str:
        """Greedy text after `prompt`, stopped (aborted, its blocks freed) as soon as `done` says so."""
        engine = self.service.engine
        text = ""
        try:
            ids = engine.require_engine().tokenize(prompt)[1][-(engine.max_model_len - max_tokens):]
            outputs = engine.generate(ids, SamplingParams(temperature=0, max_tokens=max_tokens),
                                      f"assist-{uuid.uuid4().hex}")
            try:
                async for output in outputs:
                    text = output.outputs[0].text
                    if done(text):
                        break
            finally:
                await outputs.aclose()
        except (ValueError, EngineNotReady, EngineOverloaded) as exc:
            raise as_openai_error(exc) from None
        return text

    async def chat(self, messages: list[ChatMessage], max_tokens: int) -> AsyncIterator[bytes]:
        request = ChatCompletionRequest.model_validate(chat_payload(self.service.served_name, messages, max_tokens))
        result = await ServingChat(self.service).create(request)
        assert not isinstance(result, dict)
        return result


class RemoteModel:
    def __init__(self, remote: RemoteLLM) -> None:
        self.remote = remote

    async def complete(self, prompt: str, max_tokens: int, done: Done) -> str:
        payload = {"model": await self.remote.model_name(), "prompt": prompt, "max_tokens": max_tokens,
                   "temperature": 0, "stream": True}
        upstream = await self.remote.post_stream("/v1/completions", payload)
        text = ""
        try:
            async for line in upstream.response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    raise OpenAIError(500, chunk["error"]["message"])
                text += chunk["choices"][0]["text"]
                if done(text):
                    break
        finally:
            await upstream.aclose()  # leaving early makes the LLM server abort the request
        return text

    async def chat(self, messages: list[ChatMessage], max_tokens: int) -> AsyncIterator[bytes]:
        upstream = await self.remote.post_stream(
            "/v1/chat/completions", chat_payload(await self.remote.model_name(), messages, max_tokens))
        return relay(upstream)
