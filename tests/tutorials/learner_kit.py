"""Helpers for the learner and classroom tests: the real app (bubblewrap sandbox, SQLite) with the
tutorials component, signed-in people, and the strings of a lesson that must never leak."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import api_people
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ide_server.app import create_app
from ide_server.settings import Settings
from tutorials.format import Course, Lesson, builtin_courses

COMPONENTS = [
    "ide_server.api.health:component",
    "ide_server.api.accounts:component",
    "ide_server.api.projects:component",
    "ide_server.api.files:component",
    "collab.api.editing:component",
    "ide_server.api.events:component",
    "collab.api.history:component",
    "sandbox.api:component",
    "tutorials.api:component",
]
TUTORIAL_PREFIXES = ("/api/tutorials", "/api/projects/{project_id}/lesson")


def make_app(data_dir: Path) -> FastAPI:
    settings = Settings(data_dir=data_dir, database_url=f"sqlite:///{data_dir / 'codeyard.db'}",
                        sandbox_backend="bwrap", log_level="warning")
    return create_app(settings, component_specs=COMPONENTS)


def served_client(data_dir: Path) -> Iterator[TestClient]:
    """A client whose loop runs the app's lifespan (grading runs are tasks on that loop)."""
    application = make_app(data_dir)
    with TestClient(application) as client:
        yield client
    application.state.engine.dispose()


class Person(api_people.Person):
    """A signed-in user who keeps every answer it got, for the leak checks."""

    def __init__(self, client: TestClient, token: str | None, username: str = "") -> None:
        super().__init__(client, token, username)
        self.bodies: list[str] = []

    def request(self, method: str, url: str, **kwargs):
        response = super().request(method, url, **kwargs)
        self.bodies.append(response.text)
        return response


def new_person(client: TestClient) -> Person:
    return api_people.sign_up(client, Person)


def first_python_course() -> Course:
    return next(c for c in builtin_courses().values() if c.language == "python")


def visible_text(lesson: Lesson) -> str:
    """Everything about a lesson that a learner may see."""
    parts = [lesson.title, lesson.description_md, *lesson.starter_files.values(), *lesson.solution_files.values(),
             *lesson.visible_tests.files.values()]
    for task in lesson.tasks:
        parts += [task.text_md, *task.hints]
    for check in lesson.visible_tests.io_checks:
        parts += [check.stdin, check.stdout or "", check.stdout_regex or ""]
    return "\n".join(parts)


def hidden_markers(lesson: Lesson) -> list[str]:
    """Lines of the lesson's hidden tests (sources, inputs, expected outputs) that appear nowhere a
    learner may look: if one shows up in an answer, a hidden test leaked."""
    seen = visible_text(lesson)
    pieces = list(lesson.hidden_tests.files.values())
    for check in lesson.hidden_tests.io_checks:
        pieces += [check.stdin, check.stdout or "", check.stdout_regex or ""]
    lines = {line.strip() for piece in pieces for line in piece.splitlines()}
    return sorted(line for line in lines if len(line) >= 8 and line not in seen and not re.fullmatch(r"[\W_]+", line))
