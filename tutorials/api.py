"""Tutorials API: courses and progress, the lesson inside a project, classrooms. Thin routes over
`tutorials.service` and `tutorials.classrooms`; the views below only shape their answers."""

from fastapi import APIRouter, FastAPI, status
from sqlalchemy.orm import Session

from ide_server.components import Component
from ide_server.deps import CurrentUser, DbSession, ProjectEditor, ProjectMember, SettingsDep
from ide_server.error_handlers import ERROR_RESPONSES, ErrorBody, answer_like_domain_errors
from ide_server.events import EventsDep, ProjectEvents
from ide_server.models import User
from ide_server.schemas import RandomId, UsernameParam
from ide_server.wiring import Builders
from sandbox import SandboxError
from tutorials import catalog, classrooms, service
from tutorials.checking import CheckerDep, lesson_checker
from tutorials.models import Classroom
from tutorials.schemas import (
    CheckPublic,
    ClassroomCreate,
    ClassroomJoin,
    ClassroomPublic,
    CoursePublic,
    CourseSummary,
    GradePublic,
    GridCell,
    GridColumn,
    GridPublic,
    GridRowPublic,
    HintPublic,
    IOCheckPublic,
    LessonProjectPublic,
    LessonPublic,
    LessonStarted,
    LessonSummary,
    Slug,
    SolutionPublic,
    TaskPublic,
    VisibleTestsPublic,
)

router = APIRouter(prefix="/api/tutorials", tags=["tutorials"], responses=ERROR_RESPONSES)
lesson_router = APIRouter(prefix="/api/projects/{project_id}/lesson", tags=["tutorials"], responses=ERROR_RESPONSES)


# ----- courses and progress -----


@router.get("/courses")
def list_courses(user: CurrentUser, db: DbSession) -> list[CourseSummary]:
    """The courses on offer, with how many lessons of each the caller has passed."""
    passed = service.passed_counts(db, user)
    return [
        CourseSummary(slug=c.slug, title=c.title, language=c.language, lessons=len(c.lessons), passed=passed.get(c.slug, 0))
        for c in catalog.courses().values()
    ]


@router.get("/lesson-projects")
def list_lesson_projects(user: CurrentUser, db: DbSession) -> list[LessonProjectPublic]:
    """The caller's lesson projects, so the dashboard can group them apart from their own projects."""
    return [LessonProjectPublic(project_id=row.project_id, course_slug=row.course_slug, lesson_slug=row.lesson_slug,
                                status=service.status_of(row))
            for row in service.lesson_projects(db, user) if row.project_id is not None]


@router.get("/courses/{course_slug}")
def get_course(course_slug: Slug, user: CurrentUser, db: DbSession) -> CoursePublic:
    """A course's lessons with the caller's progress in each."""
    course = catalog.find_course(course_slug)
    progress = service.progress_by_lesson(db, user, course.slug)
    lessons = []
    for lesson in course.lessons:
        row = progress.get(lesson.slug)
        lessons.append(
            LessonSummary(
                slug=lesson.slug,
                title=lesson.title,
                status=service.status_of(row),
                attempts=row.attempts if row else 0,
                hints_used=row.hints_used if row else 0,
                seconds_spent=service.seconds_spent(row) if row else None,
                project_id=row.project_id if row else None,
            )
        )
    return CoursePublic(slug=course.slug, title=course.title, language=course.language,
                        description=course.description_md, lessons=lessons)


@router.post("/courses/{course_slug}/lessons/{lesson_slug}/start")
def start_lesson(course_slug: Slug, lesson_slug: Slug, user: CurrentUser, db: DbSession, settings: SettingsDep) -> LessonStarted:
    """Open the caller's project for this lesson, creating it from the starter files the first time."""
    course = catalog.find_course(course_slug)
    lesson = catalog.find_lesson(course, lesson_slug)
    work = service.start_lesson(db, settings, user, course, lesson)
    project_id = work.progress.project_id
    assert project_id is not None  # start_lesson gives the lesson its project
    return LessonStarted(project_id=project_id, url=f"/projects/{project_id}")


# ----- the lesson of a project -----


def lesson_public(work: service.LessonWork) -> LessonPublic:
    lesson, progress = work.lesson, work.progress
    following = catalog.next_lesson(work.course, lesson)
    return LessonPublic(
        course_slug=work.course.slug,
        course_title=work.course.title,
        lesson_slug=lesson.slug,
        title=lesson.title,
        description=lesson.description_md,
        tasks=[TaskPublic(number=t.number, text=t.text_md, hints_available=len(t.hints)) for t in lesson.tasks],
        visible_tests=VisibleTestsPublic(
            files=lesson.visible_tests.files,
            io_checks=[IOCheckPublic.model_validate(check, from_attributes=True) for check in lesson.visible_tests.io_checks],
        ),
        hints=[HintPublic(task=task, text=text) for task, text in service.revealed_hints(lesson, progress.hints_used)],
        hints_total=service.hints_total(lesson),
        attempts=progress.attempts,
        status=service.status_of(progress),
        last_result=GradePublic.model_validate(progress.last_result) if progress.last_result is not None else None,
        solution_available=service.solution_unlocked(work),
        solution_after_attempts=lesson.solution_after_attempts,
        next_lesson=following.slug if following else None,
    )


@lesson_router.get("")
def get_lesson(ctx: ProjectMember, db: DbSession) -> LessonPublic | None:
    """The lesson this project was started for: description, tasks, hints revealed, progress; null when the
    project is not a lesson (most are: every workspace asks, and "none" is no error)."""
    work = service.lesson_of_project(db, ctx.project)
    return lesson_public(work) if work is not None else None


@lesson_router.post("/check", responses={503: {"model": ErrorBody, "description": "No sandbox on this server"}})
async def check_lesson(ctx: ProjectEditor, checker: CheckerDep) -> CheckPublic:
    """Grade the project's current files (open editors are saved first); counts one attempt."""
    assert ctx.user is not None  # an editor is signed in
    work, result = await checker.check(ctx.project, ctx.user)
    return CheckPublic(result=result, lesson=lesson_public(work))


@lesson_router.post("/hints")
def reveal_hint(ctx: ProjectEditor, db: DbSession) -> LessonPublic:
    """Reveal the next hint (they come one at a time); counts toward hints used."""
    work = service.work_of_project(db, ctx.project)
    service.reveal_hint(db, work)
    return lesson_public(work)


@lesson_router.get("/solution")
def get_solution(ctx: ProjectMember, db: DbSession) -> SolutionPublic:
    """The model solution, once the lesson is passed or after the lesson's number of checks."""
    return SolutionPublic(files=service.solution(service.work_of_project(db, ctx.project)))


# ----- classrooms -----


def classroom_public(db: Session, classroom: Classroom, user: User) -> ClassroomPublic:
    is_teacher = classroom.teacher_id == user.id
    return ClassroomPublic(
        id=classroom.id,
        name=classroom.name,
        teacher=classrooms.teacher_name(db, classroom),
        courses=classrooms.course_slugs(db, classroom),
        is_teacher=is_teacher,
        join_code=classroom.join_code if is_teacher else None,
        created_at=classroom.created_at,
    )


@router.post("/classrooms", status_code=status.HTTP_201_CREATED)
def create_classroom(body: ClassroomCreate, user: CurrentUser, db: DbSession) -> ClassroomPublic:
    """Create a classroom from courses; its join code is in the answer (teacher only)."""
    return classroom_public(db, classrooms.create(db, user, body.name, body.courses), user)


@router.get("/classrooms")
def list_classrooms(user: CurrentUser, db: DbSession) -> list[ClassroomPublic]:
    """Classrooms the caller teaches or has joined."""
    return [classroom_public(db, c, user) for c in classrooms.list_for_user(db, user)]


@router.post("/classrooms/join")
def join_classroom(body: ClassroomJoin, user: CurrentUser, db: DbSession) -> ClassroomPublic:
    """Join with the teacher's code; the teacher may then view your lesson projects of its courses."""
    return classroom_public(db, classrooms.join(db, user, body.code), user)


@router.get("/classrooms/{classroom_id}")
def get_classroom(classroom_id: RandomId, user: CurrentUser, db: DbSession) -> ClassroomPublic:
    return classroom_public(db, classrooms.get_for_member(db, classroom_id, user), user)


@router.delete("/classrooms/{classroom_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_classroom(classroom_id: RandomId, user: CurrentUser, db: DbSession, events: EventsDep) -> None:
    """Delete a classroom (the teacher); the teacher stops seeing its students' lesson projects."""
    classroom = classrooms.get_for_teacher(db, classroom_id, user)
    _access_changed(events, classrooms.delete(db, classroom), classroom.teacher_id)


@router.delete("/classrooms/{classroom_id}/students/{username}", status_code=status.HTTP_204_NO_CONTENT)
def remove_student(classroom_id: RandomId, username: UsernameParam, user: CurrentUser, db: DbSession, events: EventsDep) -> None:
    """The teacher removes a student, or a student leaves; the teacher stops seeing their lessons."""
    classroom = classrooms.get_for_member(db, classroom_id, user)
    _access_changed(events, classrooms.remove_student(db, classroom, username, user), classroom.teacher_id)


def _access_changed(events: ProjectEvents | None, project_ids: list[str], teacher_id: int) -> None:
    """The teacher's open editors of those projects close at once."""
    if events is not None:
        for project_id in project_ids:
            events.access_changed(project_id, teacher_id)


@router.get("/classrooms/{classroom_id}/grid")
def get_grid(classroom_id: RandomId, user: CurrentUser, db: DbSession) -> GridPublic:
    """Students by lessons with each one's status (the teacher only)."""
    columns, rows = classrooms.grid(db, classrooms.get_for_teacher(db, classroom_id, user))
    keys = [(course.slug, lesson.slug) for course, lesson in columns]
    return GridPublic(
        columns=[GridColumn(course_slug=c.slug, lesson_slug=l.slug, title=l.title) for c, l in columns],
        students=[
            GridRowPublic(
                username=row.student.username,
                cells=[
                    GridCell(
                        status=service.status_of(cell := row.cells.get(key)),
                        attempts=cell.attempts if cell else 0,
                        hints_used=cell.hints_used if cell else 0,
                        project_id=cell.project_id if cell else None,
                    )
                    for key in keys
                ],
            )
            for row in rows
        ],
    )


def _setup(app: FastAPI) -> None:
    answer_like_domain_errors(app, SandboxError)  # checks raise them, with or without the sandbox component


routes = APIRouter()
routes.include_router(router)
routes.include_router(lesson_router)
component = Component(name="tutorials", router=routes, setup=_setup, builds=Builders(checker=lesson_checker))
