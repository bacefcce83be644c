"""The lesson format: what a lesson file becomes, the errors an author gets (naming file and field),
and the built-in courses' shape."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tutorials.format import BUILTIN_DIR, IOCheck, LessonFormatError, builtin_courses, load_course, parse_lesson

LESSON = '''---
title: Greetings
solution_after_attempts: 2
---

## Description

Say hello.

```python
print("a fenced example in the description")
## not a heading: inside a fence
```

## Tasks

1. Write `greet(name)`.
   It returns `Hello, NAME!`.
2. Print a greeting.

## Hints

### Task 1
- Use an f-string.
- `return f"Hello, {name}!"`

### Task 2
- print(greet("World"))

## Starter

```python file=main.py
def greet(name):
    pass
```

## Visible tests

```python file=test_main.py
from main import greet

def test_greet():
    assert greet("Ada") == "Hello, Ada!"
```

## Hidden tests

```yaml io
- name: prints hello world
  task: 2
  stdout: "Hello, World!"
- name: mentions the world
  stdout_regex: "World"
```

## Solution

```python file=main.py
def greet(name):
    return f"Hello, {name}!"

print(greet("World"))
```
'''


def parse(text: str = LESSON, language: str = "python"):
    return parse_lesson(text, slug="greetings", language=language, file="greetings.md")


def test_a_lesson_file_becomes_a_lesson():
    lesson = parse()
    assert (lesson.slug, lesson.title, lesson.language, lesson.entry) == ("greetings", "Greetings", "python", "main.py")
    assert lesson.solution_after_attempts == 2 and lesson.timeout_seconds == 2.0
    assert lesson.description_md.startswith("Say hello.") and "## not a heading" in lesson.description_md
    assert [t.number for t in lesson.tasks] == [1, 2]
    assert lesson.tasks[0].text_md == "Write `greet(name)`.\nIt returns `Hello, NAME!`."
    assert lesson.tasks[0].hints == ["Use an f-string.", '`return f"Hello, {name}!"`']
    assert list(lesson.starter_files) == ["main.py"] and "pass" in lesson.starter_files["main.py"]
    assert list(lesson.visible_tests.files) == ["test_main.py"] and not lesson.visible_tests.io_checks
    assert lesson.hidden_tests.io_checks == [
        IOCheck("prints hello world", 2, "", "Hello, World!", None),
        IOCheck("mentions the world", None, "", None, "World"),
    ]
    assert lesson.test_files == {"test_main.py"}


def _replace(old: str, new: str) -> str:
    assert old in LESSON
    return LESSON.replace(old, new, 1)


@pytest.mark.parametrize(("old", "new", "field", "problem"), [
    ("---\ntitle: Greetings", "title: Greetings", "front matter", "starts with a '---' line"),
    ("title: Greetings\n", "", "title", "non-empty text"),
    ("solution_after_attempts: 2", "solution_after_attempts: -1", "solution_after_attempts", "whole number"),
    ("solution_after_attempts: 2", "timeout_seconds: 60", "timeout_seconds", "between 0 and 10"),
    ("solution_after_attempts: 2", "colour: blue", "front matter", "unknown keys: colour"),
    ("## Solution\n", "## Answer\n", "## Answer", "unknown section"),
    ("## Starter\n", "## Description\n", "## Description", "appears twice"),
    ("2. Print a greeting.", "3. Print a greeting.", "## Tasks", "numbered 1, 2, 3"),
    ("### Task 2\n- print(greet(\"World\"))\n", "", "## Hints / ### Task 2", "at least one hint"),
    ("### Task 2", "### Task 7", "## Hints / ### Task 7", "there is no task 7"),
    ("```python file=main.py\ndef greet(name):\n    pass", "```python\ndef greet(name):\n    pass", "## Starter", "needs a file name"),
    ("file=test_main.py", "file=checks.py", "## Visible tests", "test_NAME.py"),
    ("def test_greet():", "def test_greet()", "## Visible tests / test_main.py", "line 3"),
    ("  stdout: \"Hello, World!\"", "  stdout: \"Hello, World!\"\n  stdout_regex: \"x\"", "## Hidden tests / io[0]", "exactly one of"),
    ("  stdout_regex: \"World\"", "  stdout_regex: \"(\"", "## Hidden tests / io[1].stdout_regex", "not a valid regular expression"),
    ("  task: 2", "  task: 9", "io check 'prints hello world': task", "no task 9"),
    ("```python file=main.py\ndef greet(name):\n    pass", "```python file=../main.py\ndef greet(name):\n    pass",
     "## Starter", "not a valid file name"),
])
def test_format_errors_name_the_file_and_the_field(old, new, field, problem):
    with pytest.raises(LessonFormatError) as caught:
        parse(_replace(old, new))
    error = caught.value
    assert isinstance(error, ValueError)
    assert (error.file, error.field) == ("greetings.md", field)
    assert problem in error.problem
    assert str(error).startswith(f"greetings.md: {field}: ")


def test_a_lesson_needs_some_test():
    no_tests = LESSON[:LESSON.index("## Visible tests")] + LESSON[LESSON.index("## Solution"):]
    with pytest.raises(LessonFormatError, match="at least one test"):
        parse(no_tests)


def test_the_entry_must_be_a_starter_and_solution_file():
    with pytest.raises(LessonFormatError, match="entry: 'app.py' must be one of the starter files"):
        parse(_replace("solution_after_attempts: 2", "entry: app.py"))


def test_javascript_test_files_are_named_dot_test_js():
    with pytest.raises(LessonFormatError, match="NAME.test.js"):
        parse(LESSON, language="javascript")


def _copy_course(tmp_path: Path) -> Path:
    folder = tmp_path / "course"
    shutil.copytree(BUILTIN_DIR / "javascript-basics", folder)
    return folder


def test_course_errors_name_course_yaml(tmp_path):
    folder = _copy_course(tmp_path)
    meta = folder / "course.yaml"
    meta.write_text(meta.read_text().replace("language: javascript", "language: cobol"))
    with pytest.raises(LessonFormatError, match=r"course.yaml: language: must be one of python, javascript, not 'cobol'"):
        load_course(folder)


def test_a_listed_lesson_must_exist(tmp_path):
    folder = _copy_course(tmp_path)
    (folder / "arrays.md").unlink()
    with pytest.raises(LessonFormatError, match=r"lessons\[2\]: no file arrays.md"):
        load_course(folder)


def test_a_lesson_that_is_not_utf8_is_refused(tmp_path):
    folder = _copy_course(tmp_path)
    (folder / "arrays.md").write_bytes(b"---\ntitle: \xff\n---\n")
    with pytest.raises(LessonFormatError, match=r"arrays.md: encoding: must be UTF-8 text"):
        load_course(folder)


def test_a_folder_without_course_yaml_is_refused(tmp_path):
    with pytest.raises(LessonFormatError, match="course.yaml: missing"):
        load_course(tmp_path)


def test_builtin_courses():
    courses = builtin_courses()
    assert set(courses) == {"python-from-zero", "javascript-basics"}
    python, javascript = courses["python-from-zero"], courses["javascript-basics"]
    assert python.title == "Python from zero" and python.language == "python"
    assert [lesson.slug for lesson in python.lessons] == [
        "output-and-variables", "strings", "numbers", "conditions", "loops", "lists", "dictionaries",
        "functions", "files", "exceptions", "classes", "flask-web-app"]
    assert python.lessons[-1].entry == "app.py" and "Deploy" in python.lessons[-1].tasks[-1].text_md
    assert len(javascript.lessons) >= 4 and javascript.language == "javascript"
    for course in courses.values():
        for lesson in course.lessons:
            assert lesson.tasks and all(task.hints for task in lesson.tasks)
            assert lesson.solution_files and lesson.starter_files and lesson.hidden_tests
    assert python.lesson("loops").title == "Repeating with loops"
    with pytest.raises(KeyError):
        python.lesson("nope")
