"""Classrooms on SQLite and PostgreSQL: a teacher creates one from courses, students join with the
code, the teacher (only) sees the grid and can open each student's lesson project read-only."""

from tutorials.format import builtin_courses

COURSES = list(builtin_courses().values())
COURSE = next(c for c in COURSES if c.language == "python")
LESSON = COURSE.lessons[0]


def start(student, lesson_slug: str = LESSON.slug) -> str:
    answer = student.post(f"/api/tutorials/courses/{COURSE.slug}/lessons/{lesson_slug}/start")
    assert answer.status_code == 200, answer.text
    return answer.json()["project_id"]


def test_teacher_sees_students_by_lessons_and_views_their_projects_read_only(new_user):
    teacher, ada, bob, outsider = new_user(), new_user(), new_user(), new_user()
    early = start(ada)  # started before joining: shared with the teacher when she joins
    created = teacher.post("/api/tutorials/classrooms", json={"name": "  Year 9  ", "courses": [c.slug for c in COURSES]})
    assert created.status_code == 201, created.text
    room = created.json()
    assert room["name"] == "Year 9" and room["is_teacher"] and room["teacher"] == teacher.username
    assert room["courses"] == [c.slug for c in COURSES] and len(room["join_code"]) == 8

    # Codes are forgiving about case, spaces and dashes.
    sloppy = f" {room['join_code'][:4].lower()}-{room['join_code'][4:]} "
    joined = ada.post("/api/tutorials/classrooms/join", json={"code": sloppy})
    assert joined.status_code == 200, joined.text
    assert joined.json()["join_code"] is None and joined.json()["is_teacher"] is False
    assert bob.post("/api/tutorials/classrooms/join", json={"code": room["join_code"]}).status_code == 200
    assert bob.post("/api/tutorials/classrooms/join", json={"code": room["join_code"]}).status_code == 200  # twice: fine
    later = start(bob, COURSE.lessons[1].slug)

    grid = teacher.get(f"/api/tutorials/classrooms/{room['id']}/grid")
    assert grid.status_code == 200, grid.text
    grid = grid.json()
    keys = [(c["course_slug"], c["lesson_slug"]) for c in grid["columns"]]
    assert keys == [(c.slug, l.slug) for c in COURSES for l in c.lessons]
    rows = {row["username"]: dict(zip(keys, row["cells"])) for row in grid["students"]}
    assert list(rows) == sorted([ada.username, bob.username])
    first, second = (COURSE.slug, LESSON.slug), (COURSE.slug, COURSE.lessons[1].slug)
    assert rows[ada.username][first] == {"status": "started", "attempts": 0, "hints_used": 0, "project_id": early}
    assert rows[bob.username][first]["status"] == "not_started" and rows[bob.username][second]["project_id"] == later
    assert all(cell["status"] == "not_started" for key, cell in rows[ada.username].items() if key != first)

    # The teacher views each student's lesson project, read-only.
    for project_id in (early, later):
        project = teacher.get(f"/api/projects/{project_id}")
        assert project.status_code == 200 and project.json()["role"] == "viewer"
        name = next(iter(LESSON.starter_files))
        assert teacher.get(f"/api/projects/{project_id}/files/content/{name}").status_code == 200
        assert teacher.put(f"/api/projects/{project_id}/files/content/{name}", content=b"x = 1\n").status_code == 403
        assert teacher.post(f"/api/projects/{project_id}/lesson/check").status_code == 403
        assert teacher.post(f"/api/projects/{project_id}/lesson/hints").status_code == 403
        assert teacher.get(f"/api/projects/{project_id}/lesson").status_code == 200

    # Only the teacher sees the grid; the classroom itself only its members; ids reveal nothing.
    for student in (ada, bob):
        assert student.get(f"/api/tutorials/classrooms/{room['id']}/grid").status_code == 404
        assert student.get(f"/api/tutorials/classrooms/{room['id']}").json()["join_code"] is None
    assert outsider.get(f"/api/tutorials/classrooms/{room['id']}").status_code == 404
    assert outsider.get(f"/api/tutorials/classrooms/{room['id']}/grid").status_code == 404
    assert outsider.get(f"/api/projects/{early}").status_code == 404
    assert [c["id"] for c in ada.get("/api/tutorials/classrooms").json()] == [room["id"]]
    assert [c["id"] for c in teacher.get("/api/tutorials/classrooms").json()] == [room["id"]]
    assert outsider.get("/api/tutorials/classrooms").json() == []

    # A lesson of a course outside the classroom is not shared with its teacher.
    small = teacher.post("/api/tutorials/classrooms", json={"name": "Only one", "courses": [COURSE.slug]}).json()
    other_course = next((c for c in COURSES if c.slug != COURSE.slug), None)
    carl = new_user()
    assert carl.post("/api/tutorials/classrooms/join", json={"code": small["join_code"]}).status_code == 200
    if other_course is not None:
        elsewhere = carl.post(f"/api/tutorials/courses/{other_course.slug}/lessons/{other_course.lessons[0].slug}/start").json()
        assert teacher.get(f"/api/projects/{elsewhere['project_id']}").status_code == 404


def test_classroom_bad_input(new_user):
    teacher = new_user()
    cases = [
        ({"name": "x", "courses": []}, 422, "courses"),
        ({"name": "", "courses": [COURSE.slug]}, 422, "name"),
        ({"name": "   ", "courses": [COURSE.slug]}, 400, "name"),
        ({"name": "x", "courses": ["no-such-course"]}, 404, "no course named 'no-such-course'"),
        ({"name": "x", "courses": [COURSE.slug, COURSE.slug]}, 400, "listed twice"),
        ({"name": "x\u0000", "courses": [COURSE.slug]}, 422, "control characters"),
    ]
    for body, status, words in cases:
        answer = teacher.post("/api/tutorials/classrooms", json=body)
        assert answer.status_code == status, (body, answer.text)
        assert words in str(answer.json()["detail"]), answer.text
    assert teacher.get("/api/tutorials/classrooms").json() == []

    room = teacher.post("/api/tutorials/classrooms", json={"name": "Mine", "courses": [COURSE.slug]}).json()
    own = teacher.post("/api/tutorials/classrooms/join", json={"code": room["join_code"]})
    assert own.status_code == 409 and "you teach this classroom" in own.json()["detail"]
    wrong = new_user().post("/api/tutorials/classrooms/join", json={"code": "NOPE2345"})
    assert wrong.status_code == 404 and "join code" in wrong.json()["detail"]
    assert new_user().post("/api/tutorials/classrooms/join", json={}).status_code == 422


def test_leaving_removing_and_deleting_take_back_the_teachers_view(new_user):
    teacher, ada, bob, cleo = new_user(), new_user(), new_user(), new_user()
    room = teacher.post("/api/tutorials/classrooms", json={"name": "A", "courses": [COURSE.slug]}).json()
    same_course = teacher.post("/api/tutorials/classrooms", json={"name": "B", "courses": [COURSE.slug]}).json()
    for student in (ada, bob, cleo):
        assert student.post("/api/tutorials/classrooms/join", json={"code": room["join_code"]}).status_code == 200
    assert cleo.post("/api/tutorials/classrooms/join", json={"code": same_course["join_code"]}).status_code == 200
    projects = {student.username: start(student) for student in (ada, bob, cleo)}
    # Bob gave the teacher the editor role himself: leaving the classroom doesn't take that away.
    link = bob.post(f"/api/projects/{projects[bob.username]}/invites", json={"role": "editor"}).json()
    assert teacher.post(f"/api/invites/{link['token']}/accept").status_code == 200

    # Students can't remove each other; a student leaves; the teacher removes another.
    assert ada.delete(f"/api/tutorials/classrooms/{room['id']}/students/{bob.username}").status_code == 403
    assert ada.delete(f"/api/tutorials/classrooms/{room['id']}/students/{ada.username}").status_code == 204
    assert teacher.get(f"/api/projects/{projects[ada.username]}").status_code == 404
    assert ada.get(f"/api/tutorials/classrooms/{room['id']}").status_code == 404
    assert teacher.delete(f"/api/tutorials/classrooms/{room['id']}/students/{bob.username}").status_code == 204
    assert teacher.get(f"/api/projects/{projects[bob.username]}").json()["role"] == "editor"
    gone = teacher.delete(f"/api/tutorials/classrooms/{room['id']}/students/{bob.username}")
    assert gone.status_code == 404 and "is not a student" in gone.json()["detail"]
    assert [r["username"] for r in teacher.get(f"/api/tutorials/classrooms/{room['id']}/grid").json()["students"]] == [cleo.username]

    # Only the teacher deletes; Cleo is still in classroom B with the same course, so the view stays.
    assert cleo.delete(f"/api/tutorials/classrooms/{room['id']}").status_code == 404
    assert teacher.delete(f"/api/tutorials/classrooms/{room['id']}").status_code == 204
    assert teacher.get(f"/api/tutorials/classrooms/{room['id']}").status_code == 404
    assert teacher.get(f"/api/projects/{projects[cleo.username]}").json()["role"] == "viewer"
    assert teacher.delete(f"/api/tutorials/classrooms/{same_course['id']}").status_code == 204
    assert teacher.get(f"/api/projects/{projects[cleo.username]}").status_code == 404
    assert cleo.get(f"/api/projects/{projects[cleo.username]}").json()["role"] == "owner"
