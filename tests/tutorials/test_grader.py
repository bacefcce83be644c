"""The grader's verdicts, for real in the bubblewrap sandbox: correct, wrong, crashing, timing-out and
syntax-error code in Python and JavaScript, input/output checks, and hidden tests that never reach
the learner (neither through `to_public` nor through the learner's own program)."""

from __future__ import annotations

import json

import pytest
from sandbox_fixtures import nothing_left_behind  # noqa: F401  (autouse: every run cleans up)

from sandbox.backends.bwrap import BwrapBackend
from sandbox.limits import Limits
from sandbox.run_queue import RunQueue
from tutorials.format import parse_lesson
from tutorials.grader import grade, to_public

SECRET = "HIDDEN_SOURCE_7f3a"  # appears only in hidden test sources
HIDDEN_INPUT = "hidden-in-5521"  # the hidden check's input, and so part of its expected output

PYTHON_LESSON = f'''---
title: Adding and echoing
timeout_seconds: 1
---

## Description
Write add(a, b), and a program that echoes what it reads.

## Tasks
1. Write `add(a, b)` returning the sum.
2. Read a line and print `You said: LINE`.

## Hints
### Task 1
- return a + b
### Task 2
- print("You said:", input())

## Starter
```python file=main.py
def add(a, b):
    pass
```

## Visible tests
```python file=test_main.py
import pytest
from main import add


@pytest.mark.task(taskno=1)
def test_add_small_numbers():
    assert add(2, 3) == 5
```

```yaml io
- name: echoes hello
  task: 2
  stdin: "hello\\n"
  stdout: "You said: hello"
```

## Hidden tests
```python file=test_hidden.py
import pytest
from main import add

# {SECRET}


@pytest.mark.task(taskno=1)
def test_add_negative_numbers():
    assert add(-2, -3) == -5, "{SECRET} message"


@pytest.mark.parametrize("a", [7919])
def test_add_zero(a):
    assert add(a, 0) == a
```

```yaml io
- name: echoes a secret
  task: 2
  stdin: "{HIDDEN_INPUT}\\n"
  stdout: "You said: {HIDDEN_INPUT}"
```

## Solution
```python file=main.py
def add(a, b):
    return a + b


if __name__ == "__main__":
    print("You said:", input())
```
'''

JS_LESSON = '''---
title: Doubling
timeout_seconds: 1
---

## Description
Write double(n).

## Tasks
1. Write `double(n)`.

## Hints
### Task 1
- return n * 2

## Starter
```js file=index.js
function double(n) {}
module.exports = { double };
```

## Visible tests
```js file=index.test.js
const test = require('node:test');
const assert = require('node:assert');
const { double } = require('./index.js');

test('Task 1: doubles 21', () => {
  assert.strictEqual(double(21), 42);
});
```

## Solution
```js file=index.js
function double(n) {
  return n * 2;
}
module.exports = { double };
```
'''


@pytest.fixture(scope="module")
def lesson():
    return parse_lesson(PYTHON_LESSON, slug="adding", language="python")


@pytest.fixture(scope="module")
def js_lesson():
    return parse_lesson(JS_LESSON, slug="doubling", language="javascript")


@pytest.fixture
def bwrap():
    return BwrapBackend()


def main_py(add_body: str, echo: bool = True) -> dict[str, str]:
    program = f"def add(a, b):\n    {add_body}\n"
    if echo:
        program += '\n\nif __name__ == "__main__":\n    print("You said:", input())\n'
    return {"main.py": program}


def public_text(result) -> str:
    return json.dumps(to_public(result))


async def test_correct_code_passes_every_test_in_order(lesson, bwrap):
    result = await grade(lesson, lesson.solution_files, sandbox=bwrap)
    assert result.status == "pass" and result.passed and result.first_failure is None
    assert [(t.name, t.status, t.task_id, t.hidden) for t in result.tests] == [
        ("test_add_small_numbers", "pass", 1, False),
        ("echoes hello", "pass", 2, False),
        ("test_add_negative_numbers", "pass", 1, True),
        ("test_add_zero[1]", "pass", None, True),
        ("echoes a secret", "pass", 2, True),
    ]
    public = to_public(result)
    assert public["version"] == 3 and public["status"] == "pass"
    assert "assert add(2, 3) == 5" in public["tests"][0]["test_code"]


async def test_wrong_code_fails_with_expected_and_actual(lesson, bwrap):
    result = await grade(lesson, main_py("return a - b"), sandbox=bwrap)
    assert result.status == "fail"
    first = result.first_failure
    assert (first.test, first.task_id, first.expected, first.actual) == ("test_add_small_numbers", 1, "5", "-1")
    assert first.message == "Expected add(2, 3) to be 5, but it was -1."
    assert [t.status for t in result.tests] == ["fail", "pass", "fail", "pass", "pass"]  # a - 0 == a


async def test_the_starter_fails_and_the_first_failure_follows_the_task_order(lesson, bwrap):
    result = await grade(lesson, lesson.starter_files, sandbox=bwrap)
    assert result.status == "fail"
    assert result.first_failure.task_id == 1
    assert "it was None" in result.first_failure.message


async def test_a_crash_points_at_the_learners_line(lesson, bwrap):
    result = await grade(lesson, main_py("return a + c"), sandbox=bwrap)
    assert result.status == "fail"
    first = result.first_failure
    assert result.tests[0].status == "error"
    assert (first.file, first.line) == ("main.py", 2)
    assert "NameError" in first.message and "return a + c" in first.message
    assert "doesn't know the name 'c'" in first.message


async def test_a_syntax_error_is_an_error_explained_at_its_line(lesson, bwrap):
    result = await grade(lesson, {"main.py": "def add(a, b)\n    return a + b\n"}, sandbox=bwrap)
    assert result.status == "error" and result.tests == []
    assert "line 1 of main.py" in result.message and "':' is missing" in result.message
    assert (result.first_failure.file, result.first_failure.line) == ("main.py", 1)


async def test_an_endless_test_times_out_and_the_others_still_run(lesson, bwrap):
    result = await grade(lesson, main_py("while True:\n        pass"), sandbox=bwrap)
    assert result.status == "fail"
    by_name = {t.name: t for t in result.tests}
    assert by_name["test_add_small_numbers"].status == "error"
    assert "took longer than 1 s" in by_name["test_add_small_numbers"].message
    assert by_name["echoes hello"].status == "pass"


async def test_an_endless_loop_while_loading_is_an_error(lesson, bwrap):
    result = await grade(lesson, {"main.py": "while True:\n    pass\n"}, sandbox=bwrap)
    assert result.status == "error"
    assert "took longer than 1 s" in result.message


async def test_a_program_that_crashes_in_an_io_check_is_explained(lesson, bwrap):
    files = {"main.py": "def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    print('You said:', int(input()))\n"}
    result = await grade(lesson, files, sandbox=bwrap)
    echo = next(t for t in result.tests if t.name == "echoes hello")
    assert echo.status == "error"
    assert "line 5 of main.py" in echo.message and "int() can only turn" in echo.message


async def test_a_wrong_output_shows_what_was_expected_and_printed(lesson, bwrap):
    files = {"main.py": "def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    print('you said', input())\n"}
    result = await grade(lesson, files, sandbox=bwrap)
    echo = next(t for t in result.tests if t.name == "echoes hello")
    assert echo.status == "fail"
    assert echo.message == "When the input is 'hello\\n', your program should print:\nYou said: hello\nbut it printed:\nyou said hello"


@pytest.mark.parametrize("case", ["wrong", "crash", "correct"])
async def test_hidden_test_sources_and_values_never_reach_the_public_result(lesson, bwrap, case):
    body = {"wrong": "return a * b", "crash": "return [][a]", "correct": "return a + b"}[case]
    result = await grade(lesson, main_py(body), sandbox=bwrap)
    text = public_text(result)
    for leak in (SECRET, HIDDEN_INPUT, "add(-2, -3)", "-5", "7919"):
        assert leak not in text
    hidden = [t for t in to_public(result)["tests"] if t["hidden"]]
    assert [t["name"] for t in hidden] == ["test_add_negative_numbers", "test_add_zero[1]", "echoes a secret"]
    if case != "correct":
        assert hidden[0]["status"] != "pass" and "hidden test" in hidden[0]["message"]


async def test_a_hidden_first_failure_is_public_without_its_details(lesson, bwrap):
    result = await grade(lesson, main_py("return a + b if a > 0 else 0"), sandbox=bwrap)
    assert result.first_failure.hidden and result.first_failure.test == "test_add_negative_numbers"
    public = to_public(result)["first_failure"]
    assert public["expected"] is None and public["actual"] is None
    assert "hidden test" in public["message"] and SECRET not in json.dumps(public)


async def test_learner_code_cannot_read_the_tests_from_disk(lesson, bwrap):
    files = main_py('import os; print(sorted(os.listdir("."))); return a + b')
    result = await grade(lesson, files, sandbox=bwrap)
    assert result.tests[0].status == "pass"
    assert result.tests[0].output.strip() == "['main.py']"


async def test_async_test_functions_are_awaited(bwrap):
    lesson = parse_lesson(PYTHON_LESSON.replace("def test_add_small_numbers", "async def test_add_small_numbers"),
                          slug="adding", language="python")
    result = await grade(lesson, main_py("return a * b"), sandbox=bwrap)
    assert result.tests[0].status == "fail" and result.tests[0].actual == "6"


async def test_a_learner_file_cannot_replace_a_test(lesson, bwrap):
    files = {**main_py("return 0"), "test_hidden.py": "def test_nothing():\n    pass\n"}
    result = await grade(lesson, files, sandbox=bwrap)
    assert [t.name for t in result.tests if t.hidden] == ["test_add_negative_numbers", "test_add_zero[1]", "echoes a secret"]
    assert result.status == "fail"


@pytest.mark.parametrize("name", ["../escape.py", "/etc/passwd", ".codeyard-check/spec.json", "a//b.py", ""])
async def test_bad_file_names_are_refused(lesson, bwrap, name):
    with pytest.raises(ValueError, match="^files: "):
        await grade(lesson, {name: "x = 1\n"}, sandbox=bwrap)


async def test_grading_through_the_run_service_queues_as_the_user(lesson):
    service = RunQueue(BwrapBackend())
    try:
        result = await grade(lesson, lesson.solution_files, sandbox=service, user_id="learner-1")
        assert result.passed
    finally:
        await service.shutdown()


async def test_javascript_correct_and_wrong(js_lesson, bwrap):
    assert (await grade(js_lesson, js_lesson.solution_files, sandbox=bwrap)).passed
    wrong = await grade(js_lesson, {"index.js": "module.exports = { double: (n) => n + 2 };\n"}, sandbox=bwrap)
    assert wrong.status == "fail"
    first = wrong.first_failure
    assert (first.test, first.task_id, first.expected, first.actual) == ("Task 1: doubles 21", 1, "42", "23")
    assert first.message == "Expected double(21) to be 42, but it was 23."


async def test_javascript_crash_points_at_the_learners_line(js_lesson, bwrap):
    files = {"index.js": "function double(n) {\n  return n * tw0;\n}\nmodule.exports = { double };\n"}
    result = await grade(js_lesson, files, sandbox=bwrap)
    first = result.first_failure
    assert result.tests[0].status == "error"
    assert (first.file, first.line) == ("index.js", 2)
    assert "ReferenceError" in first.message and "doesn't know 'tw0'" in first.message


async def test_javascript_syntax_error(js_lesson, bwrap):
    result = await grade(js_lesson, {"index.js": "function double(n) {\n  return n * 2;\n\nmodule.exports = { double };\n"},
                         sandbox=bwrap)
    assert result.status == "error"
    assert "SyntaxError" in result.message and "index.js" in result.message


async def test_javascript_endless_loops_are_stopped(js_lesson, bwrap):
    in_a_test = {"index.js": "function double(n) { while (true) {} }\nmodule.exports = { double };\n"}
    result = await grade(js_lesson, in_a_test, sandbox=bwrap)
    assert result.status == "fail" and result.tests[0].status == "error"
    assert "took longer than 1 s" in result.tests[0].message
    while_loading = await grade(js_lesson, {"index.js": "while (true) {}\n"}, sandbox=bwrap)
    assert while_loading.status == "error" and "took longer than 1 s" in while_loading.message


async def test_a_run_past_its_limits_is_an_error_that_says_so(lesson, bwrap):
    slow = main_py("import time; time.sleep(0.4); return a + b")  # each test within its 1 s, all of them past 0.5 s
    result = await grade(lesson, slow, sandbox=bwrap, limits=Limits(wall_seconds=0.5))
    assert result.status == "error" and "took too long" in result.message


async def test_exiting_from_learner_code_fails_that_test_with_a_reason(lesson, js_lesson, bwrap):
    python = await grade(lesson, main_py("import sys; sys.exit(0)"), sandbox=bwrap)
    assert python.tests[0].status == "error" and "exit()" in python.tests[0].message
    javascript = await grade(js_lesson, {"index.js": "module.exports = { double: () => process.exit(0) };\n"}, sandbox=bwrap)
    assert javascript.tests[0].status == "error" and "process.exit()" in javascript.tests[0].message


async def test_a_program_that_prints_nothing_is_told_so(lesson, bwrap):
    result = await grade(lesson, main_py("return a + b", echo=False), sandbox=bwrap)
    echo = next(t for t in result.tests if t.name == "echoes hello")
    assert echo.message == "When the input is 'hello\\n', your program should print:\nYou said: hello\nbut it printed nothing."


async def test_javascript_visible_tests_show_their_code(js_lesson, bwrap):
    result = await grade(js_lesson, js_lesson.starter_files, sandbox=bwrap)
    assert "assert.strictEqual(double(21), 42);" in to_public(result)["tests"][0]["test_code"]


GREETING_LESSON = '''---
title: Hello
timeout_seconds: 2
---

## Description
Greet the world.

## Tasks
1. Print `Hello, World!`.

## Hints
### Task 1
- print("Hello, World!")

## Starter
```python file=main.py
print("hello")
```

## Visible tests
```yaml io
- name: greets
  task: 1
  stdout_regex: "^Hello, World!$"
```

## Solution
```python file=main.py
print("Hello, World!")
```
'''


async def test_an_expected_pattern_is_shown_in_words(bwrap):
    """A learner reads what to print ("a line saying: ..."), never the check's regular expression."""
    lesson = parse_lesson(GREETING_LESSON, slug="hello", language="python")
    result = await grade(lesson, {"main.py": 'print("hello")\n'}, sandbox=bwrap)
    failure = to_public(result)["first_failure"]
    assert failure["expected"] == "a line saying: Hello, World!" and failure["actual"] == "hello"
    assert failure["message"] == "Your program should print a line saying: Hello, World!, but it printed:\nhello"
