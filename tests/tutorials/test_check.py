"""`codeyard tutorials check`: the built-in courses pass it (this is what CI runs), and a broken course
fails it with exit code 2 and a message saying which lesson and why."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from sandbox_fixtures import nothing_left_behind  # noqa: F401  (autouse: every run cleans up)

from tutorials.format import BUILTIN_DIR

CODEYARD = [sys.executable, "-m", "ide_server.cli"]


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CODEYARD, "tutorials", "check", *args], capture_output=True, text=True, timeout=300)


def one_lesson_course(tmp_path: Path, lesson: str = "functions") -> Path:
    """A copy of JavaScript basics cut down to one lesson, to break on purpose."""
    folder = tmp_path / "course"
    shutil.copytree(BUILTIN_DIR / "javascript-basics", folder)
    meta = folder / "course.yaml"
    meta.write_text(meta.read_text().split("lessons:")[0] + f"lessons:\n  - {lesson}\n")
    return folder


def test_the_builtin_courses_pass_the_check():
    result = check(str(BUILTIN_DIR), "--backend", "bwrap")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "format ok: 2 course(s), 17 lesson(s)"
    assert "[1/17] javascript-basics/output-and-variables: ok" in lines[1]
    assert "[17/17] python-from-zero/flask-web-app: ok" in lines[17]
    assert lines[-1] == "all 17 lesson(s) ok: every solution passes and every starter fails"


def test_a_starter_that_already_passes_is_reported(tmp_path):
    folder = one_lesson_course(tmp_path)
    lesson = folder / "functions.md"
    text = lesson.read_text()
    solution = text[text.index("## Solution") + len("## Solution"):]  # the last section
    lesson.write_text(text[:text.index("## Starter")] + "## Starter" + solution + "\n" + text[text.index("## Visible tests"):])
    result = check(str(folder), "--backend", "bwrap")
    assert result.returncode == 2
    assert "[1/1] javascript-basics/functions: FAILED" in result.stdout
    assert "error: javascript-basics/functions: the starter files already pass every test" in result.stderr


def test_a_solution_that_fails_is_reported_with_the_failure(tmp_path):
    folder = one_lesson_course(tmp_path)
    lesson = folder / "functions.md"
    lesson.write_text(lesson.read_text().replace("const square = (n) => n * n;", "const square = (n) => n + n;"))
    result = check(str(folder), "--backend", "bwrap")
    assert result.returncode == 2
    assert ("error: javascript-basics/functions: the solution does not pass "
            "(Task 2: square(4) is 16: Expected lesson.square(4) to be 16, but it was 8.)") in result.stderr


def test_format_errors_are_one_clear_line(tmp_path):
    folder = one_lesson_course(tmp_path)
    (folder / "functions.md").write_text("no front matter\n")
    result = check(str(folder))
    assert result.returncode == 2
    assert result.stderr == (f"error: {folder / 'functions.md'}: front matter: "
                             "a lesson starts with a '---' line, YAML (title: ...), and another '---'\n")


def test_a_path_without_courses_is_refused(tmp_path):
    result = check(str(tmp_path), "--format-only")
    assert result.returncode == 2
    assert result.stderr == f"error: path: {tmp_path} is not a course folder (no course.yaml) and holds none\n"


def test_format_only_runs_nothing():
    result = check(str(BUILTIN_DIR), "--format-only")
    assert result.returncode == 0
    assert result.stdout == "format ok: 2 course(s), 17 lesson(s)\n"
