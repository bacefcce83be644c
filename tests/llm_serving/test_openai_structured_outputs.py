"""Structured outputs through the OpenAI server with the official client: `response_format`
(json_schema, json_object) and vLLM's extra fields; bad constraints are 400s naming the reason."""

from __future__ import annotations

import json
import re

import jsonschema_rs
import openai
import pytest

from .conftest import TINY_NAME

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["file", "line", "fix"],
          "properties": {"file": {"type": "string", "pattern": r"^[a-z]{1,8}\.py$"},
                         "line": {"type": "integer", "minimum": 1, "maximum": 999},
                         "fix": {"enum": ["rename", "delete", "add test"]},
                         "notes": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}}}
MESSAGES = [{"role": "user", "content": "Which fix does main.py need? Answer in JSON."}]


def json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "fix", "schema": schema, "strict": True}}


def test_chat_response_format_json_schema_validates_streamed_or_not(client):
    out = client.chat.completions.create(model=TINY_NAME, messages=MESSAGES, max_tokens=80, temperature=1.0, n=2,
                                         seed=1, response_format=json_schema_format(SCHEMA))
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        assert jsonschema_rs.is_valid(SCHEMA, json.loads(choice.message.content)), choice.message.content
    kwargs = dict(model=TINY_NAME, messages=MESSAGES, max_tokens=80, temperature=0,
                  response_format=json_schema_format(SCHEMA))
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                       if c.choices)
    assert streamed == full and jsonschema_rs.is_valid(SCHEMA, json.loads(full))


def test_completions_extra_fields_regex_choice_and_json_object(client):
    regex = client.completions.create(model=TINY_NAME, prompt="Version:", max_tokens=20, temperature=1.0, seed=2,
                                      extra_body={"structured_outputs": {"regex": r"v\d\.\d{1,2}\.\d"}})
    assert re.fullmatch(r"v\d\.\d{1,2}\.\d", regex.choices[0].text)
    choices = ["keep", "rewrite it"]
    picked = client.completions.create(model=TINY_NAME, prompt="Decide:", max_tokens=10, temperature=1.0, n=3,
                                       seed=4, extra_body={"guided_choice": choices})
    assert [c.text in choices for c in picked.choices] == [True] * 3
    guided = client.completions.create(model=TINY_NAME, prompt="Locate:", max_tokens=80, temperature=0,
                                       extra_body={"guided_json": SCHEMA})
    assert jsonschema_rs.is_valid(SCHEMA, json.loads(guided.choices[0].text))
    obj = client.chat.completions.create(model=TINY_NAME, messages=MESSAGES, max_tokens=60, temperature=0,
                                         response_format={"type": "json_object"})
    text = obj.choices[0].message.content
    assert text.startswith("{")
    if obj.choices[0].finish_reason == "stop":  # a random model may also write one string to the end
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(("extra", "message"), [
    ({"response_format": json_schema_format({"type": "strin"})}, 'invalid JSON schema: Unsupported type "strin"'),
    ({"response_format": {"type": "json_schema"}}, "json_schema is required"),
    ({"structured_outputs": {"regex": "(ab"}}, "invalid regex: Regex parsing error"),
    ({"structured_outputs": {"grammar": "root ::= nope"}}, 'Rule "nope" is not defined'),
    ({"structured_outputs": {"regexp": "a"}}, "unknown keys ['regexp']"),
    ({"structured_outputs": {"choice": []}}, "choice must be a non-empty list"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "only one output constraint per request"),
])
def test_bad_constraints_are_400_with_the_reason(client, extra, message):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=TINY_NAME, messages=MESSAGES, max_tokens=5, extra_body=extra)
    assert info.value.status_code == 400
    assert message in info.value.body["message"]
