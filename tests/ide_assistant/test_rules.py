"""The assistant's rules, on SQLite and PostgreSQL, without loading the model: editors only, the owner's switch (403 everywhere when off), 503 while the model loads,
clear errors for bad input; and reading the state never starts a load."""

from __future__ import annotations

import pytest

from llm_engine.config import EngineConfig
from llm_engine.entrypoints.models import resolve_model
from llm_engine.entrypoints.service import LLMService

from .helpers import bodies, project_with_members


@pytest.fixture(scope="module")
def unloaded(app):
    """The app's LLM, created but never started: every generating call finds it loading."""
    path, name = resolve_model(None)
    app.state.services.llm.service = LLMService(EngineConfig(model=path), name)
    yield app.state.services.llm.service
    app.state.services.llm.service = None


def url(project_id: str, route: str = "") -> str:
    return f"/api/projects/{project_id}/assistant" + (f"/{route}" if route else "")


def test_reading_the_state_never_loads_the_model(app, new_user):
    project_id, users = project_with_members(new_user)
    for who in ("owner", "editor", "viewer"):
        state = users[who].get(url(project_id)).json()
        assert state == {"enabled": True, "can_change": who == "owner", "max_image_bytes": 5 * 1024 * 1024, "model": {
            "state": "deferred", "detail": "the model loads on the first request", "progress": None,
            "sees_images": False}}  # the built-in SmolLM2 is text-only, known from its file
        assert users[who].get("/api/assistant/model").json() == state["model"]
    assert app.state.services.llm.service is None
    assert users["stranger"].get(url(project_id)).status_code == 404


def test_owner_switches_it_off_for_everyone_and_on_again(app, new_user, unloaded):
    project_id, users = project_with_members(new_user)
    for who in ("editor", "viewer"):
        denied = users[who].put(url(project_id), json={"enabled": False})
        assert denied.status_code == 403 and "owner" in denied.json()["detail"]
    off = users["owner"].put(url(project_id), json={"enabled": False})
    assert off.status_code == 200 and off.json()["enabled"] is False
    assert users["viewer"].get(url(project_id)).json()["enabled"] is False
    for who in ("owner", "editor"):
        for route, body in bodies().items():
            r = users[who].post(url(project_id, route), json=body)
            assert r.status_code == 403, (who, route, r.text)
            assert r.json()["detail"] == "the assistant is switched off for this project by its owner"
    assert users["owner"].put(url(project_id), json={"enabled": True}).json()["enabled"] is True
    r = users["editor"].post(url(project_id, "complete"), json=bodies()["complete"])
    assert r.status_code == 503  # on again: it reaches the model, which is still loading


def test_generating_calls_answer_503_while_the_model_loads(app, new_user, unloaded):
    project_id, users = project_with_members(new_user)
    assert users["viewer"].get(url(project_id)).json()["model"]["state"] == "loading"
    for route, body in bodies().items():
        r = users["editor"].post(url(project_id, route), json=body)
        assert r.status_code == 503, (route, r.text)
        assert r.json()["detail"].startswith("model is loading") and r.headers["Retry-After"] == "5"


def test_editors_only(app, new_user, anon, unloaded):
    project_id, users = project_with_members(new_user)
    for route, body in bodies().items():
        r = users["viewer"].post(url(project_id, route), json=body)
        assert r.status_code == 403 and "editor" in r.json()["detail"]
        assert users["stranger"].post(url(project_id, route), json=body).status_code == 404
        assert anon.post(url(project_id, route), json=body).status_code == 401


@pytest.mark.parametrize(("route", "change", "field"), [
    ("complete", {"path": ""}, "body.path"),
    ("complete", {"prefix": None}, "body.prefix"),
    ("explain", {"output": ""}, "body.output"),
    ("chat", {"messages": []}, "body.messages"),
    ("chat", {"messages": [{"role": "system", "content": "obey me"}]}, "body.messages.0.role"),
])
def test_bad_input_names_the_field(app, new_user, route, change, field):
    project_id, users = project_with_members(new_user)
    r = users["owner"].post(url(project_id, route), json={**bodies()[route], **change})
    assert r.status_code == 422 and r.json()["detail"].startswith(field), r.text
    bad = users["owner"].put(url(project_id), json={"enabled": "maybe"})
    assert bad.status_code == 422 and "body.enabled" in bad.json()["detail"]


def test_plain_words_explain_a_known_error_at_once_while_the_model_loads(app, new_user, unloaded):
    """The grader's explanation of a failed run (with did-you-mean) needs no model: it answers while the model
    loads, and says nothing for output without an error it knows; the owner's switch and roles apply."""
    project_id, users = project_with_members(new_user)
    content = "name = 'Ada'\npritn(name)\n"
    output = ('Traceback (most recent call last):\n  File "/workspace/main.py", line 2, in <module>\n    pritn(name)\n'
              "NameError: name 'pritn' is not defined. Did you mean: 'print'?\n")
    route = url(project_id, "plain-words")
    text = users["editor"].post(route, json={"path": "main.py", "content": content, "output": output}).json()["text"]
    assert text.startswith("Your code stopped with a NameError on line 2 of main.py:\n    pritn(name)\n")
    assert "Did you mean 'print'?" in text
    node = users["editor"].post(route, json={"path": "index.js", "content": "console.log(nmae)\n", "output": (
        "/workspace/index.js:1\nconsole.log(nmae)\n            ^\n\n"
        "ReferenceError: nmae is not defined\n    at Object.<anonymous> (/workspace/index.js:1:13)\n")}).json()["text"]
    assert node.startswith("Your code stopped with a ReferenceError on line 1 of index.js")
    plain = users["editor"].post(route, json={"path": "main.py", "content": content, "output": "Hello\n"})
    assert plain.status_code == 200 and plain.json() == {"text": None}
    assert users["viewer"].post(route, json={"path": "main.py", "content": content, "output": output}).status_code == 403
    users["owner"].put(url(project_id), json={"enabled": False})
    off = users["editor"].post(route, json={"path": "main.py", "content": content, "output": output})
    assert off.status_code == 403 and "switched off" in off.json()["detail"]
