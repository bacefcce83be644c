"""`codeyard tutorials check PATH`: validate courses and prove, in the sandbox, that every lesson's
solution passes its tests and its starter does not (a lesson whose starter already passes teaches nothing)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:
    from sandbox.backend import Backend
    from tutorials.format import Course, Lesson

app = typer.Typer(help="Author and check tutorial courses.", no_args_is_help=True)


@app.callback()
def tutorials() -> None:
    """Author and check tutorial courses."""


def course_folders(path: Path) -> list[Path]:
    """PATH itself if it is a course (has course.yaml), else its sub-folders that are; ValueError if none."""
    if (path / "course.yaml").is_file():
        return [path]
    folders = sorted(p for p in path.iterdir() if (p / "course.yaml").is_file()) if path.is_dir() else []
    if not folders:
        raise ValueError(f"path: {path} is not a course folder (no course.yaml) and holds none")
    return folders


async def verify_lesson(lesson: Lesson, backend: Backend) -> list[str]:
    """What is wrong with a lesson when graded for real: empty if its solution passes and its starter fails."""
    from tutorials.grader import grade

    problems = []
    solution = await grade(lesson, lesson.solution_files, sandbox=backend)
    if not solution.passed:
        failure = solution.first_failure
        detail = f"{failure.test}: {failure.message}" if failure else solution.message
        problems.append(f"the solution does not pass ({detail.splitlines()[0] if detail else solution.status})")
    starter = await grade(lesson, lesson.starter_files, sandbox=backend)
    if starter.passed:
        problems.append("the starter files already pass every test")
    return problems


@app.command("check")
def check_command(
    path: Annotated[Path, typer.Argument(help="A course folder, or a folder of course folders.")],
    backend: Annotated[str, typer.Option(help="Sandbox backend: auto, docker or bwrap.")] = "auto",
    format_only: Annotated[bool, typer.Option("--format-only", help="Only validate the format; run nothing.")] = False,
) -> None:
    """Validate the format, then grade every lesson's solution (must pass) and starter (must fail) in the sandbox."""
    from sandbox import SandboxUnavailable, make_backend
    from tutorials.format import LessonFormatError, load_course

    try:
        courses = [load_course(folder) for folder in course_folders(path)]
    except (LessonFormatError, ValueError, OSError) as exc:
        _fail(str(exc))
    lessons = [(course, lesson) for course in courses for lesson in course.lessons]
    typer.echo(f"format ok: {len(courses)} course(s), {len(lessons)} lesson(s)")
    if format_only:
        return
    try:
        sandbox = make_backend(backend)
    except (SandboxUnavailable, ValueError) as exc:
        _fail(str(exc.detail if isinstance(exc, SandboxUnavailable) else exc))
    problems = asyncio.run(_verify_all(lessons, sandbox))
    if problems:
        for problem in problems:
            typer.echo(f"error: {problem}", err=True)
        typer.echo(f"error: {len(problems)} problem(s) in {path}", err=True)
        raise typer.Exit(2)
    typer.echo(f"all {len(lessons)} lesson(s) ok: every solution passes and every starter fails")


async def _verify_all(lessons: list[tuple[Course, Lesson]], sandbox: Backend) -> list[str]:
    problems = []
    try:
        for index, (course, lesson) in enumerate(lessons, start=1):
            began = time.monotonic()
            found = await verify_lesson(lesson, sandbox)
            verdict = "ok" if not found else "FAILED"
            typer.echo(f"[{index}/{len(lessons)}] {course.slug}/{lesson.slug}: {verdict} ({time.monotonic() - began:.2f} s)")
            problems += [f"{course.slug}/{lesson.slug}: {p}" for p in found]
    finally:
        close = getattr(sandbox, "close", None)
        if close is not None:
            await close()
    return problems


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
