"""Progress rules on SQLite and PostgreSQL: concurrent checks and hint clicks each count once, a
pass is kept, and two concurrent starts of one lesson end with one project."""

from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import select

from ide_server.models import Project, User
from tutorials import catalog, service
from tutorials.models import LessonProgress

COURSE = next(c for c in catalog.courses().values() if c.language == "python")
LESSON = COURSE.lessons[0]


def lesson_project(user) -> str:
    return user.post(f"/api/tutorials/courses/{COURSE.slug}/lessons/{LESSON.slug}/start").json()["project_id"]


def work_of(app, project_id: str) -> service.LessonWork:
    with app.state.sessionmaker() as db:
        return service.work_of_project(db, db.get(Project, project_id))


def test_concurrent_checks_and_hints_each_count_once(app, new_user):
    project_id = lesson_project(new_user())
    outcomes = ["fail", "error", "pass", "fail"] * 3

    def check(status: str) -> None:
        with app.state.sessionmaker() as db:
            work = service.work_of_project(db, db.get(Project, project_id))
            service.record_check(db, work, status, {"status": status, "tests": []})

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(check, outcomes))
    progress = work_of(app, project_id).progress
    assert progress.attempts == len(outcomes)
    assert progress.passed_at is not None and service.status_of(progress) == "passed"

    total = service.hints_total(LESSON)

    def hint(_) -> bool:
        with app.state.sessionmaker() as db:
            try:
                service.reveal_hint(db, service.work_of_project(db, db.get(Project, project_id)))
                return True
            except Exception as exc:  # noqa: BLE001 - the Conflict of "no more hints" is what we count
                assert "no more hints" in str(exc)
                return False

    with ThreadPoolExecutor(4) as pool:
        revealed = list(pool.map(hint, range(total + 3)))
    assert sum(revealed) == total and work_of(app, project_id).progress.hints_used == total


def test_two_starts_at_once_make_one_lesson_project(app, new_user):
    user = new_user()
    with ThreadPoolExecutor(2) as pool:
        starts = list(pool.map(lambda _: user.post(f"/api/tutorials/courses/{COURSE.slug}/lessons/{LESSON.slug}/start"), range(2)))
    assert [s.status_code for s in starts] == [200, 200], [s.text for s in starts]
    assert starts[0].json()["project_id"] == starts[1].json()["project_id"]
    with app.state.sessionmaker() as db:
        owner = db.scalar(select(User).where(User.username == user.username))
        rows = db.scalars(select(LessonProgress).where(LessonProgress.user_id == owner.id)).all()
        assert len(rows) == 1
    names = [p["name"] for p in user.get("/api/projects").json()]
    assert names == [f"{COURSE.title}: {LESSON.title}"]  # the loser's project was removed


def test_each_learner_sees_their_own_lesson_projects_with_their_status(app, new_user):
    ada, bob = new_user(), new_user()
    assert ada.get("/api/tutorials/lesson-projects").json() == []
    project_id = lesson_project(ada)
    ada.post("/api/projects", json={"name": "own"}).raise_for_status()  # not a lesson: not listed
    listed = ada.get("/api/tutorials/lesson-projects").json()
    assert listed == [{"project_id": project_id, "course_slug": COURSE.slug, "lesson_slug": LESSON.slug, "status": "started"}]
    assert bob.get("/api/tutorials/lesson-projects").json() == []
    with app.state.sessionmaker() as db:
        service.record_check(db, service.work_of_project(db, db.get(Project, project_id)), "pass", {"status": "pass", "tests": []})
    assert ada.get("/api/tutorials/lesson-projects").json()[0]["status"] == "passed"
    ada.delete(f"/api/projects/{project_id}").raise_for_status()
    assert ada.get("/api/tutorials/lesson-projects").json() == []  # the progress stays; its project is gone
