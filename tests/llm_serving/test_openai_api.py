"""The OpenAI-compatible server, driven by the official `openai` client over real HTTP."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import TINY_NAME


def test_models_lists_the_served_model(client, tiny_server):
    models = client.models.list().data
    assert [m.id for m in models] == [TINY_NAME]


def test_completion_text_and_exact_usage(client, smollm_tokenizer):
    prompt = "def add(a, b):"
    out = client.completions.create(model=TINY_NAME, prompt=prompt, max_tokens=7, temperature=0,
                                    extra_body={"ignore_eos": True})
    choice = out.choices[0]
    assert choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(smollm_tokenizer(prompt).input_ids)
    assert out.usage.completion_tokens == 7
    assert out.usage.total_tokens == out.usage.prompt_tokens + 7
    assert choice.text  # 7 random tokens decode to some text


def test_greedy_is_deterministic_and_streaming_matches(client):
    kwargs = dict(model=TINY_NAME, prompt="Hello there", max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})
    first = client.completions.create(**kwargs).choices[0].text
    assert client.completions.create(**kwargs).choices[0].text == first
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == first
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_prompt_forms_and_n(client, smollm_tokenizer):
    ids = smollm_tokenizer("print(1)").input_ids
    out = client.completions.create(model=TINY_NAME, prompt=["a b c", "x y"], n=2, max_tokens=3,
                                    temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 12
    assert out.usage.prompt_tokens == len(smollm_tokenizer("a b c").input_ids) + len(smollm_tokenizer("x y").input_ids)
    by_ids = client.completions.create(model=TINY_NAME, prompt=ids, max_tokens=4, temperature=0,
                                       extra_body={"ignore_eos": True})
    by_text = client.completions.create(model=TINY_NAME, prompt="print(1)", max_tokens=4, temperature=0,
                                        extra_body={"ignore_eos": True})
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = client.completions.create(model=TINY_NAME, prompt=[ids, ids[:2]], max_tokens=2, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert len(batch.choices) == 2 and batch.usage.prompt_tokens == len(ids) + 2


def test_seed_reproducibility(client):
    kwargs = dict(model=TINY_NAME, prompt="Once upon", max_tokens=16, temperature=1.0,
                  extra_body={"ignore_eos": True})
    a = client.completions.create(seed=42, **kwargs).choices[0].text
    b = client.completions.create(seed=42, **kwargs).choices[0].text
    others = {client.completions.create(seed=s, **kwargs).choices[0].text for s in (1, 2, 3)}
    assert a == b
    assert len(others | {a}) > 1  # different seeds explore different samples


def test_stop_string_ends_the_text(client):
    kwargs = dict(model=TINY_NAME, prompt="Once upon", max_tokens=24, temperature=0,
                  extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0].text
    assert len(full) > 6
    stop = full[3:6]
    cut = client.completions.create(stop=[stop], **kwargs).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[:full.index(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=stop, stream=True, **kwargs))
    assert streamed == cut.text


def test_completion_logprobs(client):
    out = client.completions.create(model=TINY_NAME, prompt="abc", max_tokens=5, temperature=0, logprobs=3,
                                    extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0
        assert top[token] == pytest.approx(logprob) and logprob == pytest.approx(max(top.values()))  # greedy
        assert 3 <= len(top) <= 4
    assert "".join(lp.tokens) == out.choices[0].text


def test_echo_prepends_the_prompt(client):
    out = client.completions.create(model=TINY_NAME, prompt="Say hi", max_tokens=3, temperature=0, echo=True)
    assert out.choices[0].text.startswith("Say hi")


def test_chat_completion_and_usage(client, smollm_tokenizer):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    out = client.chat.completions.create(model=TINY_NAME, messages=messages, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True})
    expected = smollm_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert out.usage.prompt_tokens == len(smollm_tokenizer(expected, add_special_tokens=False).input_ids)
    assert out.usage.completion_tokens == 6
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason == "length"


def test_chat_streaming_role_first_and_done(tiny_server, smollm_tokenizer):
    body = {"model": TINY_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
            "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", tiny_server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    import json
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_logprobs_and_stream_matches(client):
    kwargs = dict(model=TINY_NAME, messages=[{"role": "user", "content": "Tell me"}], max_tokens=6,
                  temperature=0, extra_body={"ignore_eos": True})
    out = client.chat.completions.create(logprobs=True, top_logprobs=2, **kwargs)
    content = out.choices[0].logprobs.content
    assert len(content) == 6
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == pytest.approx(t.logprob) for t in content)
    assert "".join(t.token for t in content) == out.choices[0].message.content
    stream = client.chat.completions.create(stream=True, **kwargs)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == out.choices[0].message.content


def test_bad_parameters_are_400_with_openai_error(client, tiny_server):
    for kwargs in (dict(temperature=-1), dict(top_p=0), dict(n=0), dict(max_tokens=0), dict(logprobs=99),
                   dict(max_tokens=100000), dict(extra_body={"top_k": -5})):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=TINY_NAME, prompt="x", **kwargs)
        assert info.value.status_code == 400
        assert info.value.body["message"], kwargs
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=TINY_NAME, prompt=[10**9])  # token id outside the vocabulary
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=TINY_NAME, messages=[])
    raw = httpx.post(tiny_server.url + "/v1/completions", content=b"{not json", timeout=10)
    assert raw.status_code == 400 and set(raw.json()["error"]) == {"message", "type", "param", "code"}
    missing = httpx.post(tiny_server.url + "/v1/completions", json={"model": TINY_NAME}, timeout=10)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-17", prompt="x")
    assert info.value.body["code"] == "model_not_found"
