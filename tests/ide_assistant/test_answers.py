"""Real answers from the built-in SmolLM2: ghost text, streamed explanations and chat, the
per-user rate limit, and generation stopped (its KV blocks freed) once a completion is done."""

from __future__ import annotations

from .helpers import bodies, new_project, signed_in, stream_text, wait_idle


def test_completion_is_the_rest_of_the_line(model_app, smol_service):
    client = signed_in(model_app)
    project_id = new_project(client)
    r = client.post(f"/api/projects/{project_id}/assistant/complete", json=bodies()["complete"])
    assert r.status_code == 200, r.text
    text = r.json()["text"]
    assert "+ b" in text and "\n" not in text
    wait_idle(smol_service)  # it stopped at the end of the line, before its token budget: aborted, blocks freed


def test_completion_uses_the_other_open_files(model_app):
    client = signed_in(model_app)
    project_id = new_project(client)
    body = {"path": "main.py", "prefix": "from shapes import area_of_circle\n\nprint(area_",
            "open_files": [{"path": "shapes.py", "content": "def area_of_circle(radius):\n    return 3.14 * radius ** 2\n"}]}
    text = client.post(f"/api/projects/{project_id}/assistant/complete", json=body).json()["text"]
    assert text.startswith("of_circle"), text


def test_explain_streams_an_answer_and_its_continuation(model_app):
    client = signed_in(model_app)
    project_id = new_project(client)
    url = f"/api/projects/{project_id}/assistant/explain"
    text, chunks = stream_text(client, url, bodies()["explain"])
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len(chunks) >= 5 and chunks[-1]["choices"][0]["finish_reason"] == "length"  # 10 tokens: cut short
    assert len(text.split()) >= 3
    other = signed_in(model_app)  # an answer costs the test's whole burst: the next one is another user's
    more, _ = stream_text(other, f"/api/projects/{new_project(other)}/assistant/explain",
                          {**bodies()["explain"], "continue_answer": text})  # the rest of it
    assert more.strip() and not more.startswith(text)


def test_completion_follows_the_editors_indentation(model_app):
    """Code indented by two spaces reaches the model as four (as it writes best), and its next line comes back
    indented by two."""
    client = signed_in(model_app)
    project_id = new_project(client)
    body = {"path": "main.py", "prefix": "def add(a, b):\n  return a + b\n\n\ndef sub(a, b):", "suffix": "\n",
            "indent": "  "}
    text = client.post(f"/api/projects/{project_id}/assistant/complete", json=body).json()["text"]
    assert text.startswith("\n  ") and text[3:4].strip(), repr(text)
    bad = client.post(f"/api/projects/{project_id}/assistant/complete", json={**body, "indent": "x"})
    assert bad.status_code == 422 and "indent" in bad.text


def test_chat_about_the_file_streams_and_the_rate_limit_is_per_user(model_app):
    client, other = signed_in(model_app), signed_in(model_app)
    project_id = new_project(client)
    body = bodies()["chat"]
    text, _ = stream_text(client, f"/api/projects/{project_id}/assistant/chat", body)
    assert text.strip()
    # An answer costs 5 of the test's burst of 5, refilled at 1 a minute: the next one must wait.
    again = client.post(f"/api/projects/{project_id}/assistant/chat", json=body)
    assert again.status_code == 429
    assert int(again.headers["Retry-After"]) >= 1 and "too many assistant requests" in again.json()["detail"]
    # Someone else is not held back by it.
    theirs = new_project(other)
    assert other.post(f"/api/projects/{theirs}/assistant/complete", json=bodies()["complete"]).status_code == 200

