"""Checking a lesson project: save open editors, grade the files in the sandbox, count the attempt.

The database work runs in threads (the grade itself is async in the sandbox), so a check never
blocks the event loop. Grading goes through `tutorials.grader`, whose public result leaves hidden
tests' sources out.
"""

import asyncio
from pathlib import Path
from typing import Annotated

from fastapi import Depends
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import HTTPConnection

from ide_server.errors import InvalidInput
from ide_server.models import Project, User
from ide_server.services import files, projects
from ide_server.wiring import Core, required, services_of
from sandbox import ProjectRuns, SandboxUnavailable
from tutorials import grader, service
from tutorials.schemas import GradePublic

SKIPPED_FOLDERS = {"__pycache__", "node_modules"}


def learner_files(folder: Path, lesson_files: set[str]) -> dict[str, str]:
    """The project's text files (name -> text), as the grader takes them. Dot files (editor and
    tool settings), caches, binary files and big files other than the lesson's own are not the
    learner's answer, so they are left out; so are names the file tree shows escaped (a '\\'), which no
    answer file can have."""
    found: dict[str, str] = {}
    for entry in files.tree(folder):
        parts = entry.path.split("/")
        if entry.kind != "file" or "\\" in entry.path or any(p.startswith(".") or p in SKIPPED_FOLDERS for p in parts):
            continue
        if entry.size > grader.MAX_FILE_BYTES:
            if entry.path in lesson_files:
                raise InvalidInput(f"{entry.path} is too big to check (at most {grader.MAX_FILE_BYTES // 1024} KiB)")
            continue
        try:
            found[entry.path] = files.read(folder, entry.path, grader.MAX_FILE_BYTES).decode()
        except UnicodeDecodeError:
            continue
        if len(found) > grader.MAX_FILES:
            raise InvalidInput(f"a lesson project may have at most {grader.MAX_FILES} files to check; delete some")
    return found


class Checker:
    """Checks lesson projects of one app."""

    def __init__(self, sessions: sessionmaker[Session], projects_dir: Path, runs: ProjectRuns | None) -> None:
        self.sessions, self.projects_dir, self.runs = sessions, projects_dir, runs

    async def check(self, project: Project, user: User) -> tuple[service.LessonWork, GradePublic]:
        """Grade as one of `user`'s runs (the sandbox's per-user queue limits apply)."""
        work = await asyncio.to_thread(self._work, project)
        if self.runs is None or self.runs.queue is None:
            raise SandboxUnavailable(getattr(self.runs, "unavailable", "") or "this server has no sandbox to check lessons in")
        await self.runs.editors.flush(project.id)
        folder = projects.project_dir(self.projects_dir, project.id)
        own = set(work.lesson.starter_files) | set(work.lesson.solution_files)
        learner = await asyncio.to_thread(learner_files, folder, own)
        try:
            result = await grader.grade(work.lesson, learner, sandbox=self.runs.queue, user_id=str(user.id))
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        public = GradePublic.model_validate(grader.to_public(result))
        work = await asyncio.to_thread(self._record, project, public)
        return work, public

    def _work(self, project: Project) -> service.LessonWork:
        with self.sessions() as db:
            return service.work_of_project(db, project)

    def _record(self, project: Project, result: GradePublic) -> service.LessonWork:
        with self.sessions() as db:
            work = service.work_of_project(db, project)
            service.record_check(db, work, result.status, result.model_dump(mode="json"))
            return work


def lesson_checker(core: Core, *, runs: ProjectRuns | None) -> Checker:
    """The app's checker; without runs, a check answers that this server has no sandbox."""
    return Checker(core.sessions, core.settings.projects_dir, runs)


async def _checker(conn: HTTPConnection) -> Checker:
    return required(services_of(conn.app.state).checker, "tutorials")


CheckerDep = Annotated[Checker, Depends(_checker)]
