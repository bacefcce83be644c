"""Bodies of the tutorials API. Nothing here ever carries a lesson's hidden tests; the solution
travels only in SolutionPublic, which the service hands out once it is unlocked."""

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, Field

from ide_server.schemas import Line

Slug = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
LessonStatus = Literal["not_started", "started", "failing", "passed"]


class CourseSummary(BaseModel):
    slug: str
    title: str
    language: str
    lessons: int
    passed: int = Field(description="Lessons the caller has passed.")


class LessonSummary(BaseModel):
    slug: str
    title: str
    status: LessonStatus
    attempts: int
    hints_used: int
    seconds_spent: int | None = Field(description="From start to passing (or to now); null if not started.")
    project_id: str | None


class CoursePublic(BaseModel):
    slug: str
    title: str
    language: str
    description: str = Field(description="Markdown.")
    lessons: list[LessonSummary]


class LessonProjectPublic(BaseModel):
    """A project the caller works on a lesson in (the dashboard lists these apart from their own projects)."""

    project_id: str
    course_slug: str
    lesson_slug: str
    status: LessonStatus


class LessonStarted(BaseModel):
    project_id: str
    url: str = Field(description="The workspace page of the lesson project.")


class TaskPublic(BaseModel):
    number: int
    text: str
    hints_available: int


class IOCheckPublic(BaseModel):
    """A visible input/output check: run the program with this input, expect this output."""

    name: str
    task: int | None
    stdin: str
    stdout: str | None
    stdout_regex: str | None


class VisibleTestsPublic(BaseModel):
    """The lesson's visible tests (hidden tests are never sent)."""

    files: dict[str, str]
    io_checks: list[IOCheckPublic]


class HintPublic(BaseModel):
    task: int
    text: str


class TestResultPublic(BaseModel):
    """One test's outcome, Exercism v3 style; a hidden test keeps its name and verdict only."""

    name: str
    status: Literal["pass", "fail", "error"]
    message: str = ""
    output: str = ""
    task_id: int | None = None
    test_code: str = Field(default="", description="The test's source (visible tests only).")
    hidden: bool = False
    expected: str | None = None
    actual: str | None = None
    error: dict[str, Any] | None = Field(default=None, description="The exception, located in the learner's files.")


class FirstFailurePublic(BaseModel):
    """The one thing to read next: the first failing test, expected vs actual, in plain words."""

    test: str
    task_id: int | None = None
    message: str
    expected: str | None = None
    actual: str | None = None
    explanation: str = ""
    file: str | None = None
    line: int | None = None
    hidden: bool = False


class GradePublic(BaseModel):
    version: int = 3
    status: Literal["pass", "fail", "error"]
    message: str = ""
    tests: list[TestResultPublic]
    first_failure: FirstFailurePublic | None = None
    wall_seconds: float = 0.0


class LessonPublic(BaseModel):
    course_slug: str
    course_title: str
    lesson_slug: str
    title: str
    description: str
    tasks: list[TaskPublic]
    visible_tests: VisibleTestsPublic
    hints: list[HintPublic] = Field(description="The hints revealed so far, in order.")
    hints_total: int
    attempts: int
    status: LessonStatus
    last_result: GradePublic | None = Field(description="The last check's result, as it was shown.")
    solution_available: bool
    solution_after_attempts: int
    next_lesson: str | None = Field(description="Slug of the next lesson of the course, if any.")


class CheckPublic(BaseModel):
    result: GradePublic
    lesson: LessonPublic


class SolutionPublic(BaseModel):
    files: dict[str, str]


class ClassroomCreate(BaseModel):
    name: Line = Field(min_length=1, max_length=100)
    courses: list[Annotated[str, Field(max_length=64)]] = Field(min_length=1, max_length=20)


class ClassroomJoin(BaseModel):
    code: Line = Field(min_length=1, max_length=32)


class ClassroomPublic(BaseModel):
    id: str
    name: str
    teacher: str
    courses: list[str]
    is_teacher: bool
    join_code: str | None = Field(description="Shown to the teacher only.")
    created_at: datetime


class GridColumn(BaseModel):
    course_slug: str
    lesson_slug: str
    title: str


class GridCell(BaseModel):
    status: LessonStatus
    attempts: int
    hints_used: int
    project_id: str | None = Field(description="The student's lesson project (the teacher may view it).")


class GridRowPublic(BaseModel):
    username: str
    cells: list[GridCell] = Field(description="One per column, in column order.")


class GridPublic(BaseModel):
    columns: list[GridColumn]
    students: list[GridRowPublic]
