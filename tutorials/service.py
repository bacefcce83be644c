"""The learner's rules: start a lesson in a project of their own, check it, hints, solution, progress.

Courses come from files (`tutorials.format`); the database keeps only who did what in which
lesson (`LessonProgress`). A lesson project is an ordinary project the learner owns, so the
workspace, runs, history and sharing all work on it unchanged.
"""

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ide_server.errors import Conflict, NotFound, PermissionDenied
from ide_server.models import Project, User, utcnow
from ide_server.services import files, projects
from ide_server.settings import Settings
from tutorials import catalog, classrooms
from tutorials.format import Course, Lesson
from tutorials.models import LessonProgress
from tutorials.schemas import LessonStatus

# Language of a course -> the project template whose run settings fit its files.
TEMPLATE_OF_LANGUAGE = {"python": "python", "javascript": "node"}


def status_of(progress: LessonProgress | None) -> LessonStatus:
    """not_started, started (never checked), failing (last check failed) or passed (ever passed)."""
    if progress is None:
        return "not_started"
    if progress.passed_at is not None:
        return "passed"
    return "started" if progress.last_status is None else "failing"


def seconds_spent(progress: LessonProgress, now: datetime | None = None) -> int:
    """Time from starting the lesson to passing it (or to now, while not passed)."""
    end = progress.passed_at or now or utcnow()
    return max(0, int((end - progress.started_at).total_seconds()))


def progress_by_lesson(db: Session, user: User, course_slug: str) -> dict[str, LessonProgress]:
    rows = db.scalars(
        select(LessonProgress).where(LessonProgress.user_id == user.id, LessonProgress.course_slug == course_slug)
    )
    return {row.lesson_slug: row for row in rows}


def lesson_projects(db: Session, user: User) -> list[LessonProgress]:
    """The caller's lessons that have a project, in the order they were started."""
    return list(db.scalars(
        select(LessonProgress)
        .where(LessonProgress.user_id == user.id, LessonProgress.project_id.is_not(None))
        .order_by(LessonProgress.started_at, LessonProgress.id)
    ))


def passed_counts(db: Session, user: User) -> dict[str, int]:
    """Lessons passed per course slug."""
    counts: dict[str, int] = {}
    rows = db.scalars(
        select(LessonProgress.course_slug).where(LessonProgress.user_id == user.id, LessonProgress.passed_at.is_not(None))
    )
    for slug in rows:
        counts[slug] = counts.get(slug, 0) + 1
    return counts


@dataclass(frozen=True)
class LessonWork:
    """A lesson project with its lesson and the learner's progress on it."""

    course: Course
    lesson: Lesson
    progress: LessonProgress


def start_lesson(db: Session, settings: Settings, user: User, course: Course, lesson: Lesson) -> LessonWork:
    """The learner's project for this lesson: made from the starter files the first time, the
    same one afterwards (so work is never lost by starting again)."""
    progress = db.scalar(
        select(LessonProgress).where(
            LessonProgress.user_id == user.id,
            LessonProgress.course_slug == course.slug,
            LessonProgress.lesson_slug == lesson.slug,
        )
    )
    if progress is not None and progress.project_id is not None:
        return LessonWork(course, lesson, progress)
    template = TEMPLATE_OF_LANGUAGE.get(course.language, "python")
    project = projects.create(db, settings.projects_dir, user, f"{course.title}: {lesson.title}"[:100], template)
    folder = projects.project_dir(settings.projects_dir, project.id)
    _replace_files(folder, lesson.starter_files, settings.max_file_bytes)
    if progress is None:
        progress = LessonProgress(user_id=user.id, course_slug=course.slug, lesson_slug=lesson.slug, attempts=0, hints_used=0)
        db.add(progress)
    progress.project_id = project.id
    progress.started_at = utcnow()
    try:
        db.flush()
    except IntegrityError:  # a second start of the same lesson won the race: use its project
        db.rollback()
        projects.delete(db, settings.projects_dir, project)
        return start_lesson(db, settings, user, course, lesson)
    classrooms.share_with_teachers(db, user, course.slug, project.id)
    db.commit()
    return LessonWork(course, lesson, progress)


def _replace_files(folder: Path, starter: dict[str, str], max_bytes: int) -> None:
    """Swap the template's files for the lesson's starter files (a fresh project: nobody has it open)."""
    for entry in files.tree(folder):
        if "/" not in entry.path:
            files.delete(folder, entry.path)
    for name, text in starter.items():
        files.write(folder, name, text.encode(), max_bytes)


def lesson_of_project(db: Session, project: Project) -> LessonWork | None:
    """The lesson a project was started for; None when it is not a lesson project."""
    progress = db.scalar(select(LessonProgress).where(LessonProgress.project_id == project.id))
    if progress is None:
        return None
    course = catalog.find_course(progress.course_slug)
    return LessonWork(course, catalog.find_lesson(course, progress.lesson_slug), progress)


def work_of_project(db: Session, project: Project) -> LessonWork:
    """The lesson a project was started for; NotFound when it is not a lesson project."""
    if (work := lesson_of_project(db, project)) is None:
        raise NotFound("this project is not a lesson")
    return work


def record_check(db: Session, work: LessonWork, status: str, public_result: dict[str, Any]) -> None:
    """Count one attempt (in SQL, so concurrent checks each count); passed stays passed.
    `public_result` is the learner's view of the result (no hidden test in it)."""
    now = utcnow()
    values = {"attempts": LessonProgress.attempts + 1, "last_status": status, "last_checked_at": now,
              "last_result": public_result}
    if status == "pass":
        values["passed_at"] = func.coalesce(LessonProgress.passed_at, now)
    db.execute(update(LessonProgress).where(LessonProgress.id == work.progress.id).values(**values))
    db.commit()
    db.refresh(work.progress)


def hints_total(lesson: Lesson) -> int:
    return sum(len(task.hints) for task in lesson.tasks)


def revealed_hints(lesson: Lesson, count: int) -> list[tuple[int, str]]:
    """The first `count` hints in lesson order, each with the number of the task it helps with."""
    hints = [(task.number, hint) for task in lesson.tasks for hint in task.hints]
    return hints[:count]


def reveal_hint(db: Session, work: LessonWork) -> None:
    """One more hint; hints come one at a time, in order (two quick clicks reveal two, never more
    than there are)."""
    revealed = cast(CursorResult[Any], db.execute(
        update(LessonProgress)
        .where(LessonProgress.id == work.progress.id, LessonProgress.hints_used < hints_total(work.lesson))
        .values(hints_used=LessonProgress.hints_used + 1)
    )).rowcount
    db.commit()
    if not revealed:
        raise Conflict("there are no more hints for this lesson")
    db.refresh(work.progress)


def solution_unlocked(work: LessonWork) -> bool:
    """After passing, or after the lesson's number of attempts."""
    progress = work.progress
    return progress.passed_at is not None or progress.attempts >= work.lesson.solution_after_attempts


def solution(work: LessonWork) -> dict[str, str]:
    if not solution_unlocked(work):
        left = work.lesson.solution_after_attempts - work.progress.attempts
        raise PermissionDenied(f"the solution opens when you pass, or after {left} more check{'s' if left != 1 else ''}")
    return work.lesson.solution_files
