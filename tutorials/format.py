"""The lesson format: a course folder with `course.yaml`, and one Markdown file per lesson.

    tutorials/courses/python-from-zero/
        course.yaml        slug, title, language (python | javascript), description, lessons: [slug, ...]
        hello.md           one lesson per listed slug

A lesson file is YAML front matter (`title`, optional `entry`, `solution_after_attempts`,
`timeout_seconds`) then level-2 sections, in any order:

    ## Description        Markdown shown above the tasks
    ## Tasks              a numbered list: 1. ..., 2. ...  (continuation lines indented)
    ## Hints              `### Task N` subsections, each a bullet list of hints, revealed one at a time
    ## Starter            fenced code blocks with a file name: ```python file=main.py
    ## Visible tests      test files the learner sees (```python file=test_main.py) and/or input/output
                          checks (```yaml io: a list of {name, task, stdin, stdout | stdout_regex})
    ## Hidden tests       the same kinds, never shown to the learner (only their names and verdicts)
    ## Solution           fenced code blocks with a file name

Unit tests are pytest-style files for Python (`test_*.py`, plain asserts, `@pytest.mark.task(taskno=N)`
names the task) and `node:test` files for JavaScript (`*.test.js`, CommonJS; a test or `describe`
named "Task N: ..." belongs to task N). Every problem is a `LessonFormatError` naming the file and
the field, so an author can fix it from the message alone.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

LANGUAGES = {"python": "main.py", "javascript": "index.js"}  # language -> default entry file
SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
SECTIONS = ("description", "tasks", "hints", "starter", "visible tests", "hidden tests", "solution")
REQUIRED_SECTIONS = ("description", "tasks", "hints", "starter", "solution")
TEST_FILE = {"python": re.compile(r"^(.*/)?test_[A-Za-z0-9_]+\.py$"), "javascript": re.compile(r"^(.*/)?[A-Za-z0-9_.-]+\.test\.js$")}
MAX_TEST_SECONDS = 10.0
BUILTIN_DIR = Path(__file__).resolve().parent / "courses"


class LessonFormatError(ValueError):
    """A course or lesson breaks the format; `file` and `field` say where."""

    def __init__(self, file: Path | str, field: str, problem: str) -> None:
        super().__init__(f"{file}: {field}: {problem}")
        self.file, self.field, self.problem = str(file), field, problem


@dataclass(frozen=True)
class Task:
    """One numbered step of a lesson, with its hints in the order they are revealed."""

    number: int
    text_md: str
    hints: list[str]


@dataclass(frozen=True)
class IOCheck:
    """Run the lesson's entry file with `stdin`; its output must equal `stdout` (trailing whitespace
    aside) or match `stdout_regex` (re.search, multiline)."""

    name: str
    task: int | None
    stdin: str = ""
    stdout: str | None = None
    stdout_regex: str | None = None


@dataclass(frozen=True)
class Tests:
    """Unit test files (name -> source) and input/output checks, run in that order."""

    files: dict[str, str] = field(default_factory=dict)
    io_checks: list[IOCheck] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.files or self.io_checks)


@dataclass(frozen=True)
class Lesson:
    slug: str
    title: str
    language: str
    description_md: str
    tasks: list[Task]
    starter_files: dict[str, str]
    visible_tests: Tests
    hidden_tests: Tests
    solution_files: dict[str, str]
    entry: str  # the file a run (and every input/output check) starts
    solution_after_attempts: int = 3  # the solution may be shown after this many failed checks (or a pass)
    timeout_seconds: float = 2.0  # per test or check

    @property
    def test_files(self) -> set[str]:
        return set(self.visible_tests.files) | set(self.hidden_tests.files)


@dataclass(frozen=True)
class Course:
    slug: str
    title: str
    language: str
    description_md: str
    lessons: list[Lesson]

    def lesson(self, slug: str) -> Lesson:
        """The lesson called slug; KeyError if the course has none."""
        for lesson in self.lessons:
            if lesson.slug == slug:
                return lesson
        raise KeyError(slug)


def load_course(path: Path | str) -> Course:
    """Read and validate a course folder (LessonFormatError on the first problem found)."""
    folder = Path(path)
    meta_file = folder / "course.yaml"
    if not meta_file.is_file():
        raise LessonFormatError(folder, "course.yaml", "missing: a course is a folder with a course.yaml")
    meta = _yaml_mapping(_read(meta_file), meta_file, "course.yaml")
    slug = _slug(meta.get("slug"), meta_file, "slug")
    title = _text(meta.get("title"), meta_file, "title")
    language = meta.get("language")
    if language not in LANGUAGES:
        raise LessonFormatError(meta_file, "language", f"must be one of {', '.join(LANGUAGES)}, not {language!r}")
    order = meta.get("lessons")
    if not isinstance(order, list) or not order:
        raise LessonFormatError(meta_file, "lessons", "must be a non-empty list of lesson slugs (file names without .md)")
    if len(set(map(str, order))) != len(order):
        raise LessonFormatError(meta_file, "lessons", "lists a lesson twice")
    lessons = []
    for index, lesson_slug in enumerate(order):
        lesson_slug = _slug(lesson_slug, meta_file, f"lessons[{index}]")
        lesson_file = folder / f"{lesson_slug}.md"
        if not lesson_file.is_file():
            raise LessonFormatError(meta_file, f"lessons[{index}]", f"no file {lesson_file.name} in {folder}")
        lessons.append(parse_lesson(_read(lesson_file), slug=lesson_slug, language=language, file=lesson_file))
    description = meta.get("description", "")
    if not isinstance(description, str):
        raise LessonFormatError(meta_file, "description", "must be text")
    return Course(slug, title, language, description.strip(), lessons)


@cache
def builtin_courses() -> dict[str, Course]:
    """The courses shipped in tutorials/courses/, by slug (loaded once per process)."""
    courses = [load_course(p) for p in sorted(BUILTIN_DIR.iterdir()) if (p / "course.yaml").is_file()]
    return {course.slug: course for course in courses}


def parse_lesson(text: str, *, slug: str, language: str, file: Path | str = "<lesson>") -> Lesson:
    """One lesson from its Markdown text (file is only used in error messages)."""
    front, body = _split_front_matter(text, file)
    sections = _sections(body, file)
    for name in REQUIRED_SECTIONS:
        if name not in sections:
            raise LessonFormatError(file, f"## {name.capitalize()}", "section missing")
    title = _text(front.get("title"), file, "title")
    tasks_text = _numbered_items("\n".join(sections["tasks"]), file)
    hints = _hints(sections["hints"], file, len(tasks_text))
    tasks = [Task(n, text_md, hints.get(n, [])) for n, text_md in enumerate(tasks_text, start=1)]
    for task in tasks:
        if not task.hints:
            raise LessonFormatError(file, f"## Hints / ### Task {task.number}", "every task needs at least one hint")
    starter = _files(sections["starter"], file, "## Starter")
    solution = _files(sections["solution"], file, "## Solution")
    visible = _tests(sections.get("visible tests", []), file, "## Visible tests", language)
    hidden = _tests(sections.get("hidden tests", []), file, "## Hidden tests", language)
    if not visible and not hidden:
        raise LessonFormatError(file, "## Visible tests", "a lesson needs at least one test (visible or hidden)")
    for name in set(visible.files) & set(hidden.files):
        raise LessonFormatError(file, "## Hidden tests", f"{name} is also a visible test file")
    for name in (set(visible.files) | set(hidden.files)) & (set(starter) | set(solution)):
        raise LessonFormatError(file, "## Starter", f"{name} is a test file; learner files and test files must differ")
    entry = front.get("entry", LANGUAGES[language])
    if not isinstance(entry, str) or entry not in starter or entry not in solution:
        raise LessonFormatError(file, "entry", f"{entry!r} must be one of the starter files and one of the solution files")
    attempts = front.get("solution_after_attempts", 3)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
        raise LessonFormatError(file, "solution_after_attempts", f"must be a whole number >= 0, not {attempts!r}")
    timeout = front.get("timeout_seconds", 2.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TEST_SECONDS:
        raise LessonFormatError(file, "timeout_seconds", f"must be a number of seconds between 0 and {MAX_TEST_SECONDS:g}")
    for check in visible.io_checks + hidden.io_checks:
        if check.task is not None and not 1 <= check.task <= len(tasks):
            raise LessonFormatError(file, f"io check {check.name!r}: task", f"there is no task {check.task}")
    unknown = set(front) - {"title", "entry", "solution_after_attempts", "timeout_seconds"}
    if unknown:
        raise LessonFormatError(file, "front matter", f"unknown keys: {', '.join(sorted(unknown))}")
    return Lesson(slug, title, language, "\n".join(sections["description"]).strip(), tasks, starter, visible, hidden,
                  solution, entry, attempts, float(timeout))


def check_file_name(name: str, field: str = "files") -> str:
    """A learner or lesson file name: relative, no '..', no hidden parts; ValueError naming the field."""
    path = PurePosixPath(name)
    if (not name or "\\" in name or "\0" in name or path.is_absolute() or len(name) > 200
            or any(part in ("", ".", "..") or part.startswith(".") for part in name.split("/"))):
        raise ValueError(f"{field}: {name!r} is not a valid file name (relative, no '..', no hidden folders)")
    return name


# --- parsing helpers -------------------------------------------------------------------------

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*(.*)$")


def _read(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LessonFormatError(file, "encoding", "must be UTF-8 text") from None


def _yaml_mapping(text: str, file: Path | str, field: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise LessonFormatError(file, field, f"is not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise LessonFormatError(file, field, "must be a YAML mapping (key: value lines)")
    return data


def _slug(value: object, file: Path | str, field: str) -> str:
    if not isinstance(value, str) or not SLUG.match(value):
        raise LessonFormatError(file, field, f"must be lowercase letters, digits and dashes, not {value!r}")
    return value


def _text(value: object, file: Path | str, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise LessonFormatError(file, field, "must be non-empty text")
    return value.strip()


def _split_front_matter(text: str, file: Path | str) -> tuple[dict[str, Any], str]:
    lines = text.replace("\r\n", "\n").split("\n")
    if not lines or lines[0].strip() != "---":
        raise LessonFormatError(file, "front matter", "a lesson starts with a '---' line, YAML (title: ...), and another '---'")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise LessonFormatError(file, "front matter", "no closing '---' line") from None
    return _yaml_mapping("\n".join(lines[1:end]), file, "front matter"), "\n".join(lines[end + 1:])


def _sections(body: str, file: Path | str) -> dict[str, list[str]]:
    """Level-2 sections by lowercased heading; headings inside code fences don't count."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    fence = None
    for number, line in enumerate(body.split("\n"), start=1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and _closes(line, fence):
            fence = None
        if fence is None and line.startswith("## "):
            name = line[3:].strip().lower()
            if name not in SECTIONS:
                known = ", ".join(s.capitalize() for s in SECTIONS)
                raise LessonFormatError(file, f"## {line[3:].strip()}", f"unknown section (known: {known})")
            if name in sections:
                raise LessonFormatError(file, f"## {line[3:].strip()}", "section appears twice")
            current = sections[name] = []
        elif current is not None:
            current.append(line)
        elif line.strip():
            raise LessonFormatError(file, "body", f"line {number}: text before the first '## ' section")
    if fence is not None:
        raise LessonFormatError(file, "body", "a code fence is never closed")
    return sections


def _closes(line: str, fence: str) -> bool:
    """A closing fence: the opening fence's character, at least as many, nothing after."""
    text = line.strip()
    return text.startswith(fence) and set(text) == {fence[0]}


def _numbered_items(text: str, file: Path | str) -> list[str]:
    items: list[list[str]] = []
    for line in text.split("\n"):
        match = re.match(r"^(\d+)\.\s+(.*)$", line)
        if match:
            if int(match.group(1)) != len(items) + 1:
                raise LessonFormatError(file, "## Tasks", f"tasks must be numbered 1, 2, 3...; found {match.group(1)}.")
            items.append([match.group(2)])
        elif items and (line.startswith(("  ", "\t")) or not line.strip()):
            items[-1].append(line.strip())
        elif line.strip():
            raise LessonFormatError(file, "## Tasks", f"expected a numbered item ('1. ...'), got {line.strip()[:40]!r}")
    if not items:
        raise LessonFormatError(file, "## Tasks", "needs at least one numbered task ('1. ...')")
    return ["\n".join(item).strip() for item in items]


def _hints(lines: list[str], file: Path | str, task_count: int) -> dict[int, list[str]]:
    hints: dict[int, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for line in lines:
        heading = re.match(r"^###\s+Task\s+(\d+)\s*$", line, re.IGNORECASE)
        if heading:
            number = int(heading.group(1))
            if not 1 <= number <= task_count:
                raise LessonFormatError(file, f"## Hints / ### Task {number}", f"there is no task {number}")
            if number in hints:
                raise LessonFormatError(file, f"## Hints / ### Task {number}", "appears twice")
            current = hints[number] = []
        elif line.startswith("- ") and current is not None:
            current.append([line[2:]])
        elif current and (line.startswith(("  ", "\t")) or not line.strip()):
            current[-1].append(line.strip())
        elif line.strip():
            raise LessonFormatError(file, "## Hints", f"expected '### Task N' then '- hint' lines, got {line.strip()[:40]!r}")
    return {n: ["\n".join(h).strip() for h in items] for n, items in hints.items()}


def _code_blocks(lines: list[str], file: Path | str, field: str) -> list[tuple[dict[str, str], set[str], str]]:
    """Fenced blocks as (key=value attributes, bare words of the info string, content)."""
    blocks = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, info = match.groups()
        end = next((j for j in range(i + 1, len(lines)) if _closes(lines[j], fence)), None)
        if end is None:
            raise LessonFormatError(file, field, f"code fence {fence} is never closed")
        words = info.split()
        attrs = dict(w.split("=", 1) for w in words if "=" in w)
        blocks.append((attrs, {w for w in words if "=" not in w}, "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return blocks


def _files(lines: list[str], file: Path | str, field: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for attrs, _, content in _code_blocks(lines, file, field):
        name = attrs.get("file")
        if name is None:
            raise LessonFormatError(file, field, "every code block needs a file name: ```python file=main.py")
        try:
            check_file_name(name, field)
        except ValueError as exc:
            raise LessonFormatError(file, field, str(exc)) from None
        if name in files:
            raise LessonFormatError(file, field, f"file {name} appears twice")
        files[name] = content
    if not files:
        raise LessonFormatError(file, field, "needs at least one code block with a file name")
    return files


def _tests(lines: list[str], file: Path | str, field: str, language: str) -> Tests:
    files: dict[str, str] = {}
    checks: list[IOCheck] = []
    for attrs, words, content in _code_blocks(lines, file, field):
        if "io" in words:
            checks += _io_checks(content, file, field)
            continue
        name = attrs.get("file")
        if name is None or not TEST_FILE[language].match(name):
            pattern = "test_NAME.py" if language == "python" else "NAME.test.js"
            raise LessonFormatError(file, field, f"a test block needs file={pattern} (got {name!r}), or is ```yaml io")
        if name in files:
            raise LessonFormatError(file, field, f"file {name} appears twice")
        if language == "python":
            try:
                ast.parse(content, name)
            except SyntaxError as exc:
                raise LessonFormatError(file, f"{field} / {name}", f"line {exc.lineno}: {exc.msg}") from None
        files[name] = content
    names = [c.name for c in checks]
    if len(set(names)) != len(names):
        raise LessonFormatError(file, field, "two input/output checks have the same name")
    return Tests(files, checks)


def _io_checks(content: str, file: Path | str, field: str) -> list[IOCheck]:
    try:
        items = yaml.safe_load(content)
    except yaml.YAMLError as exc:
        raise LessonFormatError(file, f"{field} / io", f"is not valid YAML ({exc})") from None
    if not isinstance(items, list) or not items:
        raise LessonFormatError(file, f"{field} / io", "must be a YAML list of checks (- name: ...)")
    checks = []
    for index, item in enumerate(items):
        where = f"{field} / io[{index}]"
        if not isinstance(item, dict):
            raise LessonFormatError(file, where, "must be a mapping with name, stdin, stdout or stdout_regex")
        unknown = set(item) - {"name", "task", "stdin", "stdout", "stdout_regex"}
        if unknown:
            raise LessonFormatError(file, where, f"unknown keys: {', '.join(sorted(unknown))}")
        name = _text(item.get("name"), file, f"{where}.name")
        task = item.get("task")
        if task is not None and (isinstance(task, bool) or not isinstance(task, int)):
            raise LessonFormatError(file, f"{where}.task", "must be a task number")
        stdin, stdout, regex = item.get("stdin", ""), item.get("stdout"), item.get("stdout_regex")
        if not isinstance(stdin, str):
            raise LessonFormatError(file, f"{where}.stdin", "must be text")
        if (stdout is None) == (regex is None):
            raise LessonFormatError(file, where, "needs exactly one of stdout and stdout_regex")
        if stdout is not None and not isinstance(stdout, str):
            raise LessonFormatError(file, f"{where}.stdout", "must be text")
        if regex is not None:
            try:
                re.compile(regex)
            except (re.error, TypeError) as exc:
                raise LessonFormatError(file, f"{where}.stdout_regex", f"is not a valid regular expression ({exc})") from None
        checks.append(IOCheck(name, task, stdin, stdout, regex))
    return checks
