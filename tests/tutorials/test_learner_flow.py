"""A learner works through lesson 1 of the built-in Python course in the real app: the project comes
from the starter files, checks grade in the bubblewrap sandbox and count, hints come one at a
time, the solution opens only when allowed, progress shows on the course page, and no answer of
any tutorials endpoint ever carries the lesson's hidden tests."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from learner_kit import COMPONENTS, TUTORIAL_PREFIXES, first_python_course, hidden_markers, new_person, served_client
from sandbox_fixtures import nothing_left_behind  # noqa: F401  (autouse: every run cleaned up)

from ide_server.access import app_routes
from ide_server.app import create_app
from ide_server.errors import InvalidInput
from ide_server.settings import Settings
from tutorials.checking import learner_files
from tutorials.format import builtin_courses
from tutorials.grader import MAX_FILE_BYTES

COURSE = first_python_course()
LESSON = COURSE.lessons[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from served_client(tmp_path_factory.mktemp("data"))


def put_files(person, project_id: str, files: dict[str, str]) -> None:
    for name, text in files.items():
        assert person.put(f"/api/projects/{project_id}/files/content/{name}", content=text.encode()).status_code in (200, 201)


def test_lesson_one_from_start_to_pass(served):
    learner = new_person(served)
    lesson_url = f"/api/tutorials/courses/{COURSE.slug}/lessons/{LESSON.slug}/start"

    started = learner.post(lesson_url)
    assert started.status_code == 200, started.text
    project_id = started.json()["project_id"]
    assert started.json()["url"] == f"/projects/{project_id}"
    tree = {e["path"] for e in learner.get(f"/api/projects/{project_id}/files").json() if e["kind"] == "file"}
    assert tree == set(LESSON.starter_files)
    for name, text in LESSON.starter_files.items():
        assert learner.get(f"/api/projects/{project_id}/files/content/{name}").text == text
    # Starting again opens the same project (work is never thrown away).
    assert learner.post(lesson_url).json()["project_id"] == project_id

    base = f"/api/projects/{project_id}/lesson"
    lesson = learner.get(base).json()
    assert (lesson["title"], lesson["status"], lesson["attempts"], lesson["hints"]) == (LESSON.title, "started", 0, [])
    assert [t["number"] for t in lesson["tasks"]] == [t.number for t in LESSON.tasks]
    assert lesson["visible_tests"]["files"] == LESSON.visible_tests.files
    assert [c["name"] for c in lesson["visible_tests"]["io_checks"]] == [c.name for c in LESSON.visible_tests.io_checks]
    assert lesson["solution_available"] is False
    assert lesson["next_lesson"] == COURSE.lessons[1].slug
    denied = learner.get(f"{base}/solution")
    assert denied.status_code == 403 and "solution opens" in denied.json()["detail"]

    # The starter fails, with a first failure to read.
    failed = learner.post(f"{base}/check")
    assert failed.status_code == 200, failed.text
    result = failed.json()["result"]
    assert result["status"] in ("fail", "error")
    assert result["first_failure"]["message"]
    assert failed.json()["lesson"]["attempts"] == 1 and failed.json()["lesson"]["status"] == "failing"
    assert learner.get(base).json()["last_result"] == result  # shown again after a reload

    # Hints one at a time, in order, until there are none left.
    all_hints = [(t.number, h) for t in LESSON.tasks for h in t.hints]
    for shown in range(1, len(all_hints) + 1):
        answer = learner.post(f"{base}/hints")
        assert answer.status_code == 200
        assert [(h["task"], h["text"]) for h in answer.json()["hints"]] == all_hints[:shown]
    no_more = learner.post(f"{base}/hints")
    assert no_more.status_code == 409 and "no more hints" in no_more.json()["detail"]

    # The learner fixes the code: it passes, and the solution opens.
    put_files(learner, project_id, LESSON.solution_files)
    passed = learner.post(f"{base}/check").json()
    assert passed["result"]["status"] == "pass", passed["result"]
    assert all(t["status"] == "pass" for t in passed["result"]["tests"])
    assert passed["lesson"]["status"] == "passed" and passed["lesson"]["solution_available"] is True
    assert learner.get(f"{base}/solution").json()["files"] == LESSON.solution_files

    # Breaking it again later keeps the lesson passed (progress is never taken away).
    put_files(learner, project_id, LESSON.starter_files)
    assert learner.post(f"{base}/check").json()["lesson"]["status"] == "passed"

    course = learner.get(f"/api/tutorials/courses/{COURSE.slug}").json()
    assert course["description"] == COURSE.description_md
    first = course["lessons"][0]
    assert (first["status"], first["attempts"], first["hints_used"], first["project_id"]) == (
        "passed", 3, len(all_hints), project_id)
    assert first["seconds_spent"] is not None and first["seconds_spent"] >= 0
    assert {lesson["status"] for lesson in course["lessons"][1:]} == {"not_started"}
    listed = {c["slug"]: c for c in learner.get("/api/tutorials/courses").json()}
    assert listed[COURSE.slug]["passed"] == 1 and listed[COURSE.slug]["lessons"] == len(COURSE.lessons)

    # Another user sees none of it, and can't check or read this lesson project.
    other = new_person(served)
    assert other.get(base).status_code == 404
    assert other.post(f"{base}/check").status_code == 404
    assert other.get(f"/api/tutorials/courses/{COURSE.slug}").json()["lessons"][0]["status"] == "not_started"


def test_the_solution_opens_after_the_lessons_number_of_attempts(served):
    learner = new_person(served)
    project_id = learner.post(f"/api/tutorials/courses/{COURSE.slug}/lessons/{LESSON.slug}/start").json()["project_id"]
    base = f"/api/projects/{project_id}/lesson"
    for attempt in range(LESSON.solution_after_attempts):
        assert learner.get(f"{base}/solution").status_code == 403
        lesson = learner.post(f"{base}/check").json()["lesson"]
        assert lesson["attempts"] == attempt + 1
    assert lesson["status"] == "failing" and lesson["solution_available"] is True
    assert learner.get(f"{base}/solution").json()["files"] == LESSON.solution_files


def test_no_tutorials_answer_carries_hidden_tests(served):
    """Every tutorials route is called (the test fails if a new one is not), for a lesson with
    hidden tests, while it is failing; no answer contains any line of a hidden test."""
    lesson = next(l for l in COURSE.lessons if hidden_markers(l))
    markers = hidden_markers(lesson)
    teacher, learner = new_person(served), new_person(served)
    classroom = teacher.post("/api/tutorials/classrooms", json={"name": "Leaks", "courses": [COURSE.slug]}).json()
    learner.post("/api/tutorials/classrooms/join", json={"code": classroom["join_code"]})
    project_id = learner.post(f"/api/tutorials/courses/{COURSE.slug}/lessons/{lesson.slug}/start").json()["project_id"]
    assert learner.post(f"/api/projects/{project_id}/lesson/check").json()["result"]["status"] != "pass"
    values = {"course_slug": COURSE.slug, "lesson_slug": lesson.slug, "project_id": project_id,
              "classroom_id": classroom["id"], "username": learner.username}
    called: set[tuple[str, str]] = set()
    routes = [r for r in app_routes(served.app.routes) if r.path.startswith(TUTORIAL_PREFIXES)]
    assert len(routes) >= 10
    # Deletes last (leaving, then deleting the classroom), so every other route sees it all.
    calls = sorted(((method, route) for route in routes for method in route.methods), key=lambda call: call[0] == "DELETE")
    for method, route in calls:
        url = route.path_format.format(**{name: values[name] for name in route.params})
        body = {"POST": {}}.get(method)
        if route.path.endswith("/classrooms"):
            body = {"name": "Another", "courses": [COURSE.slug]}
        if route.path.endswith("/join"):
            body = {"code": classroom["join_code"]}
        for person in (learner, teacher):
            response = person.request(method, url, **({} if body is None else {"json": body}))
            assert response.status_code < 500, f"{method} {url}: {response.text}"
        called.add((method, route.path))
    assert called == {(m, r.path) for r in routes for m in r.methods}
    for body in learner.bodies + teacher.bodies:
        leaked = [m for m in markers if m in body]
        assert not leaked, f"hidden test text in an answer: {leaked[:3]}: {body[:300]}"


def test_bad_input_answers_4xx_with_a_message(served):
    learner = new_person(served)
    cases = [
        ("POST", f"/api/tutorials/courses/no-such-course/lessons/{LESSON.slug}/start", 404, "no course"),
        ("POST", f"/api/tutorials/courses/{COURSE.slug}/lessons/no-such-lesson/start", 404, "no lesson"),
        ("GET", "/api/tutorials/courses/Bad..Slug", 422, "course_slug"),
        ("GET", "/api/tutorials/courses/no-such-course", 404, "no course"),
    ]
    for method, url, status, words in cases:
        response = learner.request(method, url)
        assert response.status_code == status, (url, response.text)
        assert words in str(response.json()["detail"])
    # A project that is not a lesson: reading its lesson gives null (every workspace asks), the other routes say so.
    plain = learner.post("/api/projects", json={"name": "plain"}).json()["id"]
    none = learner.get(f"/api/projects/{plain}/lesson")
    assert none.status_code == 200 and none.json() is None
    for method, suffix in (("POST", "/check"), ("POST", "/hints"), ("GET", "/solution")):
        response = learner.request(method, f"/api/projects/{plain}/lesson{suffix}")
        assert response.status_code == 404 and response.json()["detail"] == "this project is not a lesson"
    assert served.get(f"/api/tutorials/courses/{COURSE.slug}").status_code == 401


def test_a_javascript_lesson_is_checked_through_the_same_flow(served):
    course = next(c for c in builtin_courses().values() if c.language == "javascript")
    lesson = course.lessons[0]
    learner = new_person(served)
    project_id = learner.post(f"/api/tutorials/courses/{course.slug}/lessons/{lesson.slug}/start").json()["project_id"]
    assert learner.get(f"/api/projects/{project_id}").json()["template"] == "node"
    base = f"/api/projects/{project_id}/lesson"
    assert learner.post(f"{base}/check").json()["result"]["status"] in ("fail", "error")
    put_files(learner, project_id, lesson.solution_files)
    assert learner.post(f"{base}/check").json()["result"]["status"] == "pass"


def test_only_the_learners_own_text_files_are_graded(tmp_path):
    (tmp_path / "main.py").write_text("print('hi')\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("later\n")
    for skipped in (".editorconfig", "__pycache__/main.cpython-311.pyc", "node_modules/x/index.js", ".git/config"):
        (tmp_path / skipped).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / skipped).write_text("skip me\n")
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    (tmp_path / "big.csv").write_text("x" * (MAX_FILE_BYTES + 1))
    assert learner_files(tmp_path, {"main.py"}) == {"main.py": "print('hi')\n", "notes/todo.txt": "later\n"}
    (tmp_path / "main.py").write_text("x" * (MAX_FILE_BYTES + 1))
    with pytest.raises(InvalidInput, match="main.py is too big to check"):
        learner_files(tmp_path, {"main.py"})


def test_checking_without_a_sandbox_answers_503_in_words(tmp_path):
    components = [c for c in COMPONENTS if not c.startswith("sandbox.")]
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'codeyard.db'}", log_level="warning")
    application = create_app(settings, component_specs=components)
    with TestClient(application) as client:
        learner = new_person(client)
        project_id = learner.post(f"/api/tutorials/courses/{COURSE.slug}/lessons/{LESSON.slug}/start").json()["project_id"]
        answer = learner.post(f"/api/projects/{project_id}/lesson/check")
        assert answer.status_code == 503 and "sandbox" in answer.json()["detail"]
        assert learner.get(f"/api/projects/{project_id}/lesson").json()["attempts"] == 0
    application.state.engine.dispose()
