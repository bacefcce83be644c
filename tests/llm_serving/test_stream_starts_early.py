"""A stream's headers before its first token (`_Serving.start`'s `stream`): a prompt the engine can
no longer refuse once sent starts at once, the rest wait for their first output so that what the
engine refuses is still a status code; the token-count bound that decides whether a text fits."""

from __future__ import annotations

import asyncio
import json
import random
from types import SimpleNamespace

import httpx
import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from llm_engine import SamplingParams, StructuredOutputsParams
from llm_engine.engine_loop import AbortRequest, AddRequest, Command, ContextLengthExceeded
from llm_engine.entrypoints.protocol import OpenAIError
from llm_engine.entrypoints.serving import ServingCompletion
from llm_engine.request_streams import RequestStreams
from llm_engine.tokenizer import token_count_bound

from .conftest import TINY_NAME
from .test_backpressure_and_metrics import wait_for


class Engine(RequestStreams):
    """The serving side of an engine whose commands are recorded and never answered by itself."""

    def __init__(self, tokenizer, max_model_len: int) -> None:
        super().__init__(max_waiting=100, on_step=None)
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.sent: list[Command] = []

    def _submit(self, command: Command) -> None:
        self.sent.append(command)

    def check_ready(self) -> None:
        pass


def serving(engine: Engine) -> ServingCompletion:
    return ServingCompletion(SimpleNamespace(engine=engine))  # type: ignore[arg-type]


def test_a_stream_the_engine_cannot_refuse_starts_before_its_first_output(smollm_tokenizer):
    async def main() -> None:
        engine = Engine(smollm_tokenizer, max_model_len=512)
        run = await serving(engine).start(["def f(x):"], [SamplingParams(max_tokens=16)], 0, "cmpl-a",
                                          fit_window=True, stream=True)
        assert [c.request_id for c in engine.sent if isinstance(c, AddRequest)] == ["cmpl-a-0"]
        engine.fail("cmpl-a-0", RuntimeError("engine step failed: boom"))  # after the headers went
        with pytest.raises(OpenAIError) as failed:
            await anext(run.updates)
        assert failed.value.status == 500 and "boom" in failed.value.message  # the stream's error event

    asyncio.run(main())


@pytest.mark.parametrize("prompt, params, stream", [
    ("def f(x):", SamplingParams(max_tokens=16), False),  # not a stream
    ("x " * 300, SamplingParams(max_tokens=16), True),  # 600 bytes: the bound cannot show it fits 512
    ("def f(x):", SamplingParams(max_tokens=600), True),  # max_tokens past the window
    ("def f(x):", SamplingParams(max_tokens=16, structured_outputs=StructuredOutputsParams(regex="[0-9]+")), True),
    ([1, 2, 3], SamplingParams(max_tokens=16), True),  # token ids the engine checks against its vocabulary
])
def test_what_the_engine_may_refuse_waits_for_its_first_output_and_is_a_status(smollm_tokenizer, prompt, params,
                                                                             stream):
    async def main() -> None:
        engine = Engine(smollm_tokenizer, max_model_len=512)
        started = asyncio.ensure_future(serving(engine).start([prompt], [params], 0, "cmpl-b", fit_window=True,
                                                              stream=stream))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not started.done() and len(engine.sent) == 1  # sent, and waiting for the engine's answer
        engine.fail("cmpl-b-0", ContextLengthExceeded("This model's maximum context length is 512 tokens"))
        with pytest.raises(OpenAIError) as refused:
            await started
        assert refused.value.status == 400

    asyncio.run(main())


def test_the_bound_holds_for_any_text_of_a_byte_level_tokenizer(smollm_tokenizer):
    """Multibyte characters, emoji, combining marks, special tokens written in the text, long runs."""
    rng = random.Random(0)
    pieces = ["a", "aaaa", " ", "   ", "\n", "\t", "é", "€", "😀", "㍻", "\u0301", "字", "ﬁ", "\x00", "<|im_start|>"]
    for _ in range(500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))
        bound = token_count_bound(smollm_tokenizer, text)
        assert bound is not None and len(smollm_tokenizer(text).input_ids) <= bound


def _tokenizer(pre_tokenizer, normalizer=None) -> PreTrainedTokenizerFast:
    raw = RawTokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        raw.normalizer = normalizer
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")


@pytest.mark.parametrize("tokenizer", [
    _tokenizer(pre_tokenizers.Metaspace()),  # SentencePiece-like: a character may be several byte tokens
    _tokenizer(pre_tokenizers.ByteLevel(), normalizers.NFKC()),  # a normalizer may lengthen the text
    _tokenizer(pre_tokenizers.Whitespace()),
], ids=["metaspace", "normalized", "whitespace"])
def test_other_tokenizers_give_no_bound_and_their_streams_wait(tokenizer):
    assert token_count_bound(tokenizer, "def f(x):") is None


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"model": TINY_NAME, "prompt": "x " * 600, "max_tokens": 2, "stream": True}, "prompt"),
    ("/v1/completions", {"model": TINY_NAME, "prompt": "x", "max_tokens": 600, "stream": True}, "max_tokens"),
])
def test_a_streamed_prompt_past_the_window_is_still_a_400(tiny_server, path, body, param):
    response = httpx.post(tiny_server.url + path, timeout=30, json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    v2 = httpx.post(f"{tiny_server.url}/v2/models/{TINY_NAME}/generate_stream", timeout=30,
                    json={"text_input": body["prompt"], "max_tokens": body["max_tokens"]})
    assert v2.status_code == 400 and "maximum context length" in v2.json()["error"]


def test_a_stream_that_starts_early_streams_as_before(tiny_server, smollm_tokenizer):
    """Tokens, usage (the prompt's token count, known only once the engine answered) and [DONE]."""
    with httpx.stream("POST", tiny_server.url + "/v1/completions", timeout=60,
                      json={"model": TINY_NAME, "prompt": "def f(x):", "max_tokens": 4, "temperature": 0,
                            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage = httpx.Response(200, content=events[-2]).json()["usage"]
    assert usage["completion_tokens"] == 4 and usage["prompt_tokens"] == len(smollm_tokenizer("def f(x):").input_ids)


# On a real server whose engine's commands are held back (nothing runs until `release`):

V1 = ("/v1/completions", {"model": TINY_NAME, "prompt": "def held(x):", "max_tokens": 3, "temperature": 0,
                          "ignore_eos": True, "stream": True})
V2 = (f"/v2/models/{TINY_NAME}/generate_stream", {"text_input": "def held(x):", "max_tokens": 3, "temperature": 0,
                                                   "ignore_eos": True})


@pytest.fixture
def held(tiny_server, monkeypatch) -> list[AddRequest]:
    """The engine's requests kept in this list instead of reaching the core: nothing runs until
    `release`."""
    commands: list[AddRequest] = []
    monkeypatch.setattr(tiny_server.service.engine, "_submit", commands.append)
    return commands


def release(tiny_server, commands: list[AddRequest]) -> None:
    engine = tiny_server.service.engine
    for command in commands:
        type(engine)._submit(engine, command)


def data_lines(response: httpx.Response) -> list[str]:
    return [line.removeprefix("data: ") for line in response.iter_lines() if line]


@pytest.mark.parametrize("path, body", [V1, V2])
def test_the_headers_arrive_while_the_request_has_no_token_yet(tiny_server, held, path, body):
    with httpx.stream("POST", tiny_server.url + path, json=body, timeout=20) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        assert len(held) == 1 and isinstance(held[0], AddRequest)  # submitted, never run: no token exists
        release(tiny_server, held)
        lines = data_lines(response)
    assert lines[-1] == "[DONE]" if path.startswith("/v1") else "error" not in lines[-1]
    assert not any("error" in json.loads(line) for line in lines if line != "[DONE]")


@pytest.mark.parametrize("path, body", [V1, V2])
def test_an_engine_failure_after_the_headers_is_an_error_event(tiny_server, held, path, body):
    with httpx.stream("POST", tiny_server.url + path, json=body, timeout=20) as response:
        assert response.status_code == 200
        tiny_server.service.engine.fail(held[0].request_id, RuntimeError("engine step failed: boom"))
        lines = data_lines(response)
    error = json.loads(lines[0])["error"]
    assert "engine step failed: boom" in (error["message"] if isinstance(error, dict) else error)


@pytest.mark.parametrize("path, body", [V1, V2])
def test_a_client_gone_before_the_first_token_aborts_its_request(tiny_server, held, path, body):
    with httpx.stream("POST", tiny_server.url + path, json=body, timeout=20) as response:
        assert response.status_code == 200
    wait_for(lambda: any(isinstance(c, AbortRequest) for c in held), timeout=20)
    assert [c.request_id for c in held if isinstance(c, AbortRequest)] == [held[0].request_id]
    release(tiny_server, held)  # the core adds and aborts it, and the server forgets it
    wait_for(lambda: not tiny_server.service.engine._streams, timeout=20)
