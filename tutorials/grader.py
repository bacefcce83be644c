"""Grade a learner's files against a lesson's tests, in the sandbox, in one run.

The lesson's tests and a small runner of our own (`runners/`) are written next to the learner's
files in a scratch project; the runner reads every test source into memory and deletes it before
any learner code runs, executes the unit tests and input/output checks one by one (each with its
own timeout, output captured), and prints one JSON line after a random marker. The result is
shaped like Exercism's test-runner results.json v3 (status, message, tests in order, each with
name, status, message, output, task_id) plus `first_failure`, the one thing a beginner should read
next, in plain words. `to_public` is the only view meant for learners: hidden tests keep their name
and verdict but never their source, expected values or output.
"""

from __future__ import annotations

import json
import re
import secrets
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandbox import (
    MIB,
    Backend,
    ErrorInfo,
    Limits,
    RunQueue,
    RunResult,
    RunSpec,
    Verdict,
    error_from_output,
    explain_error,
)
from tutorials.format import Lesson, check_file_name

Status = Literal["pass", "fail", "error"]
RUNNERS = Path(__file__).resolve().parent / "runners"
CHECK_DIR = ".codeyard-check"  # dot folder: no learner file may live there (check_file_name)
MAX_FILES, MAX_FILE_BYTES = 50, 256 * 1024
OUTPUT_SHOWN = 2000  # characters of a test's output kept (Exercism keeps 500; beginners print more)


@dataclass
class TestResult:
    """One test or input/output check, as Exercism's v3 `tests[]` entry plus what the UI needs."""

    name: str
    status: Status
    message: str = ""  # what went wrong, in plain words (empty on pass)
    output: str = ""  # what the learner's code printed during this test
    task_id: int | None = None
    test_code: str = ""  # the test's source (visible tests only)
    hidden: bool = False
    expected: str | None = None
    actual: str | None = None
    error: ErrorInfo | None = None  # the exception, located in the learner's files where possible


@dataclass
class FirstFailure:
    """The first failing test, explained for a beginner: what was expected, what happened, where."""

    test: str
    task_id: int | None
    message: str
    expected: str | None = None
    actual: str | None = None
    explanation: str = ""  # friendly explanation of an error (syntax error, NameError...)
    file: str | None = None
    line: int | None = None
    hidden: bool = False


@dataclass
class GradeResult:
    version: int = 3
    status: Status = "pass"
    message: str = ""  # set when status is "error": the tests could not run at all
    tests: list[TestResult] = field(default_factory=list)
    first_failure: FirstFailure | None = None
    wall_seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"


async def grade(lesson: Lesson, files: Mapping[str, str], *, sandbox: Backend | RunQueue,
                user_id: str = "tutorials", limits: Limits | None = None) -> GradeResult:
    """Check `files` (learner file name -> text) against every test of `lesson`, in one sandbox run.

    sandbox: a Backend, or the app's RunQueue (then the run queues like any other of `user_id`
    and QueueFull may be raised). Bad file names or sizes raise ValueError naming `files`."""
    _check_files(files)
    began = time.monotonic()
    marker = f"codeyard-results-{secrets.token_hex(8)}"
    with tempfile.TemporaryDirectory(prefix="codeyard-grade-") as scratch:
        project = Path(scratch)
        project.chmod(0o755)
        for name, text in files.items():
            if name in lesson.test_files:
                continue  # a learner file can't replace a test
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            (project / name).write_text(text, encoding="utf-8")
        argv = _write_check(project, lesson, marker)
        run = await _run(sandbox, RunSpec(argv, project, limits or _limits(lesson)), user_id, lesson.slug)
    result = _result(lesson, run, marker, files)
    result.wall_seconds = round(time.monotonic() - began, 4)
    return result


def to_public(result: GradeResult) -> dict[str, Any]:
    """The result as JSON for the learner: hidden tests without source, expected values, output or error text."""
    tests = [_public_test(test) for test in result.tests]
    failure = asdict(result.first_failure) if result.first_failure else None
    if failure and failure["hidden"] and tests:
        public = next(t for t in tests if t["hidden"] and t["name"] == failure["test"])
        failure.update(message=public["message"], explanation=public["message"] if public["error"] else "",
                       expected=None, actual=None)
        if public["error"] is None:
            failure.update(file=None, line=None)
    return {"version": result.version, "status": result.status, "message": result.message, "tests": tests,
            "first_failure": failure, "wall_seconds": result.wall_seconds}


def _public_test(test: TestResult) -> dict[str, Any]:
    item = asdict(test)
    if test.hidden:
        error = test.error if test.error is not None and test.error.in_learner_file else None
        item.update(test_code="", output="", expected=None, actual=None, message=_hidden_message(test),
                    error=None if error is None else {**asdict(error), "message": ""})  # a message may quote hidden inputs
    return item


# --- preparing the run ---------------------------------------------------------------------


def _check_files(files: Mapping[str, str]) -> None:
    if not isinstance(files, Mapping) or len(files) > MAX_FILES:
        raise ValueError(f"files: must be a mapping of at most {MAX_FILES} file names to text")
    for name, text in files.items():
        check_file_name(name, "files")
        if not isinstance(text, str) or len(text.encode()) > MAX_FILE_BYTES:
            raise ValueError(f"files: {name} must be text of at most {MAX_FILE_BYTES // 1024} KiB")


def _limits(lesson: Lesson) -> Limits:
    checks = sum(1 for _ in _test_entries(lesson)) or 1
    seconds = min(2 + checks * lesson.timeout_seconds, 30)
    return Limits(cpu_seconds=seconds, wall_seconds=seconds + 2, memory_bytes=256 * MIB, pids=64, output_bytes=2 * MIB)


def _test_entries(lesson: Lesson) -> Iterator[tuple[bool, str, Any]]:  # item: (name, source) or an IOCheck
    """(hidden, kind, item) in grading order: visible unit tests, visible checks, then the hidden ones."""
    for hidden, tests in ((False, lesson.visible_tests), (True, lesson.hidden_tests)):
        for name, source in tests.files.items():
            yield hidden, "file", (name, source)
        for check in tests.io_checks:
            yield hidden, "io", check


def _write_check(project: Path, lesson: Lesson, marker: str) -> list[str]:
    """The runner and its spec in CHECK_DIR; returns the command that runs them."""
    checks = [{"kind": "file", "file": item[0], "source": item[1], "hidden": hidden} if kind == "file"
              else {"kind": "io", **asdict(item), "hidden": hidden} for hidden, kind, item in _test_entries(lesson)]
    spec = {"marker": marker, "entry": lesson.entry, "timeout": lesson.timeout_seconds,
            "single_task": 1 if len(lesson.tasks) == 1 else None, "checks": checks}
    folder = project / CHECK_DIR
    folder.mkdir()
    (folder / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    runner = "python_runner.py" if lesson.language == "python" else "node_runner.js"
    (folder / runner).write_text((RUNNERS / runner).read_text(encoding="utf-8"), encoding="utf-8")
    interpreter = ["python3", "-I", "-B"] if lesson.language == "python" else ["node"]
    return [*interpreter, f"{CHECK_DIR}/{runner}", f"{CHECK_DIR}/spec.json"]


async def _run(sandbox: Backend | RunQueue, spec: RunSpec, user_id: str, slug: str) -> RunResult:
    if isinstance(sandbox, RunQueue):
        record = await sandbox.submit(user_id, f"lesson:{slug}", spec)
        await sandbox.close_stdin(record.id)
        record = await sandbox.wait(record.id)
        assert record.result is not None
        return record.result
    return await sandbox.run(spec)


# --- reading the results ------------------------------------------------------------------


def _runner_report(run: RunResult, marker: str) -> dict[str, Any] | None:
    """The runner's JSON line (the last one after the marker), or None if it never printed one."""
    text = run.stdout.decode("utf-8", "replace")
    _, found, tail = text.rpartition(marker + " ")
    if not found:
        return None
    try:
        report = json.loads(tail.split("\n", 1)[0])
    except json.JSONDecodeError:
        return None
    valid = isinstance(report, dict) and (isinstance(report.get("load_error"), dict) or isinstance(report.get("tests"), list))
    return report if valid else None


def _result(lesson: Lesson, run: RunResult, marker: str, files: Mapping[str, str]) -> GradeResult:
    report = _runner_report(run, marker)
    if report is None:
        return _run_failed(lesson, run, files)
    if report.get("load_error"):
        error = ErrorInfo.from_dict(report["load_error"])
        explanation = _timeout_message(lesson) if error.type == "Timeout" else explain_error(error, lesson.language, files)
        failure = FirstFailure(test=error.test_file or "", task_id=None, message=explanation, explanation=explanation,
                               file=error.file if error.in_learner_file else None,
                               line=error.line if error.in_learner_file else None, hidden=bool(report.get("load_error_hidden")))
        return GradeResult(status="error", message=explanation, first_failure=failure)
    tests = [_test_result(lesson, item, files) for item in report["tests"]]
    failing = [t for t in tests if t.status != "pass"]  # tests stay in file order; the advice follows the task order
    failed = min(failing, key=lambda t: t.task_id or len(lesson.tasks) + 1) if failing else None
    return GradeResult(status="fail" if failed else "pass", tests=tests, first_failure=_first_failure(failed) if failed else None)


def _test_result(lesson: Lesson, item: dict[str, Any], files: Mapping[str, str]) -> TestResult:
    error = ErrorInfo.from_dict(item["error"]) if item.get("error") else None
    if error is None and item.get("stderr"):  # an input/output check whose program crashed
        error = error_from_output(item["stderr"], lesson.language, files)
    expected = item.get("expected")
    if expected is not None and item.get("stdout_regex") is not None:
        expected = _regex_in_words(expected)  # learners are shown "a line saying: Hi", never "^Hi$"
    test = TestResult(name=item["name"], status=item["status"], output=item.get("output", "")[:OUTPUT_SHOWN],
                      task_id=item.get("task"), test_code="" if item["hidden"] else item.get("test_code", ""),
                      hidden=item["hidden"], expected=expected, actual=item.get("actual"), error=error)
    test.message = _message(lesson, item, test, files)
    return test


def _message(lesson: Lesson, item: dict[str, Any], test: TestResult, files: Mapping[str, str]) -> str:
    kind = item.get("kind")
    if test.status == "pass":
        return ""
    if kind == "timeout":
        return _timeout_message(lesson)
    if test.error is not None:
        return explain_error(test.error, lesson.language, files)
    note = f" ({item['note']})" if item.get("note") else ""
    if kind == "io":
        program = f"When the input is {item['stdin']!r}, your program" if item.get("stdin") else "Your program"
        printed = f"but it printed:\n{test.actual}" if test.actual else "but it printed nothing."
        if item.get("stdout_regex") is not None:
            return f"{program} should print {test.expected}, {printed}"
        return f"{program} should print:\n{test.expected}\n{printed}"
    if kind == "compare":
        words = "to be" if item.get("op") == "==" else item["op_words"]
        return f"Expected {item.get('expression') or 'the value'} {words} {test.expected}, but it was {test.actual}.{note}"
    if item.get("note"):
        note_text: str = item["note"]
        return note_text
    return f"This check was not true: {item.get('expression') or 'assert'}"


def _regex_in_words(pattern: str) -> str:
    """'^Hello, World!$' -> 'a line saying: Hello, World!'; patterns with wildcards are shown as they are."""
    core = re.sub(r"^(\^|\\A)|(\$|\\Z)$", "", pattern)
    if re.search(r"(?<!\\)[.*+?\[\](){}|^$]|\\(?!n)\w", core):
        return f"text matching the pattern {pattern}"
    text = re.sub(r"\\(.)", r"\1", core.replace("\\n", "\n"))
    if pattern.startswith("\\A"):
        return f"output starting with:\n{text}"
    if pattern.startswith("^") and pattern.endswith("$"):
        return f"a line saying: {text}"
    if pattern.startswith("^"):
        return f"a line starting with: {text}"
    return f"text containing: {text}"


def _timeout_message(lesson: Lesson) -> str:
    return (f"Your code took longer than {lesson.timeout_seconds:g} s and was stopped. "
            "Is there a loop that never ends, or an input() waiting for typing?")


def _first_failure(test: TestResult) -> FirstFailure:
    error = test.error
    return FirstFailure(test=test.name, task_id=test.task_id, message=test.message, expected=test.expected, actual=test.actual,
                        explanation=test.message if error else "",
                        file=error.file if error and error.in_learner_file else None,
                        line=error.line if error and error.in_learner_file else None, hidden=test.hidden)


def _hidden_message(test: TestResult) -> str:
    if test.status == "pass":
        return ""
    base = f"A hidden test ({test.name}) did not pass: it tries cases the visible tests don't show."
    if test.error is not None and test.error.in_learner_file:
        return f"{base} It stopped with {test.error.type} at line {test.error.line} of {test.error.file}."
    return f"{base} Think about other inputs (empty, zero, negative, longer ones)."


def _run_failed(lesson: Lesson, run: RunResult, files: Mapping[str, str]) -> GradeResult:
    """The runner never reported: the whole run hit a limit, or crashed before the tests ran."""
    reasons = {
        Verdict.TIME_LIMIT: "Your code took too long in all and was stopped. Is there a loop that never ends?",
        Verdict.MEMORY_LIMIT: "Your code used too much memory and was stopped. Is a list growing forever?",
        Verdict.OUTPUT_LIMIT: "Your code printed too much and was stopped. Is there a print inside a loop that never ends?",
        Verdict.CANCELLED: "The check was cancelled.",
    }
    message = reasons.get(run.verdict)
    error = None
    if message is None:
        error = error_from_output(run.stderr.decode("utf-8", "replace"), lesson.language, files)
        message = explain_error(error, lesson.language, files) if error else (
            "The check stopped before it could report "
            f"({run.message or f'exit code {run.exit_code}, signal {run.signal}'}): {run.stderr.decode('utf-8', 'replace')[-500:]}")
    failure = FirstFailure(test="", task_id=None, message=message, explanation=message if error else "",
                           file=error.file if error and error.in_learner_file else None,
                           line=error.line if error and error.in_learner_file else None)
    return GradeResult(status="error", message=message, first_failure=failure)
