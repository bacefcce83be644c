"""Friendly explanations of real errors: each program below is run (on the host: it is ours, not a
learner's) and what Python or Node printed becomes an explanation pointing at the learner's line."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox import ErrorInfo, error_from_output, explain_error

PYTHON_CASES = [
    # (program, type, line, words the explanation must contain)
    ("greeting = 'Hi'\nprint(greting)\n", "NameError", 2, "Did you mean 'greeting'?"),
    ("print(pritn_me)\n", "NameError", 1, "doesn't know the name 'pritn_me'"),
    ("age = 3\nprint('Age: ' + age)\n", "TypeError", 2, "joined text and an int"),
    ("total = 0\nfor n in [1, '2']:\n    total = total + n\n", "TypeError", 3, "can't combine an int and a str"),
    ("def area(w, h):\n    return w * h\n\narea(3)\n", "TypeError", 4, "too few values"),
    ("items = [1, 2, 3]\nprint(items[3])\n", "IndexError", 2, "Positions start at 0"),
    ("ages = {'Ada': 36}\nprint(ages['Alan'])\n", "KeyError", 2, "no key 'Alan'"),
    ("total = 10\ncount = 0\nprint(total / count)\n", "ZeroDivisionError", 3, "divided by zero"),
    ("if True:\nprint('hi')\n", "IndentationError", 2, "indented"),
    ("if True:\n    x = 1\n      y = 2\n", "IndentationError", 3, "spaces it shouldn't have"),
    ("names = []\nnames.push('Ada')\n", "AttributeError", 2, "has no 'push'"),
    ("result = print('x')\nresult.upper()\n", "AttributeError", 2, "on None"),
    ("number = int('seven')\n", "ValueError", 1, "int() can only turn"),
    ("if 1 > 0\n    print('yes')\n", "SyntaxError", 1, "':' is missing"),
    ("print('hello)\n", "SyntaxError", 1, "closing quote"),
    ("x = (1 + 2\n", "SyntaxError", 1, "never closed"),
]

NODE_CASES = [
    ("const name = 'Ada';\nconsole.log(nmae);\n", "ReferenceError", 2, "doesn't know 'nmae'"),
    ("let person;\nconsole.log(person.name);\n", "TypeError", 2, ".name of something that is undefined"),
    ("const n = 1;\nn = 2;\n", "TypeError", 2, "Declare it with let"),
    ("const greet = 5;\ngreet();\n", "TypeError", 2, "isn't one"),
    ("console.log('hi';\n", "SyntaxError", 1, "')' is missing"),
    ("function f() {\n  return 1;\n", "SyntaxError", None, "ends too early"),
]


def run_program(tmp_path: Path, argv: list[str], name: str, source: str) -> str:
    (tmp_path / name).write_text(source)
    proc = subprocess.run([*argv, f"./{name}"], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    # the sandbox runs files from /workspace; make the report look the same
    return proc.stderr.replace(str(tmp_path), "/workspace")


@pytest.mark.parametrize(("source", "kind", "line", "words"), PYTHON_CASES)
def test_python_errors_are_explained_at_the_learners_line(tmp_path, source, kind, line, words):
    stderr = run_program(tmp_path, ["python3"], "main.py", source)
    error = error_from_output(stderr, "python", {"main.py": source})
    assert error is not None and error.type == kind
    assert (error.file, error.line, error.in_learner_file) == ("main.py", line, True)
    text = explain_error(error, "python", {"main.py": source})
    assert words in text
    assert text.startswith(f"Your code {'could not be read' if kind.endswith(('SyntaxError', 'IndentationError')) else 'stopped'}")
    assert f"line {line} of main.py:\n    {source.splitlines()[line - 1].strip()}" in text


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize(("source", "kind", "line", "words"), NODE_CASES)
def test_node_errors_are_explained(tmp_path, source, kind, line, words):
    stderr = run_program(tmp_path, ["node"], "index.js", source)
    error = error_from_output(stderr, "javascript", {"index.js": source})
    assert error is not None and error.type == kind
    assert error.file == "index.js"
    if line is not None:
        assert error.line == line
    assert words in explain_error(error, "javascript", {"index.js": source})


def test_an_unknown_error_still_says_what_happened():
    error = ErrorInfo("OverflowError", "math range error", "main.py", 3, in_learner_file=True)
    text = explain_error(error, "python", {"main.py": "a\nb\nx = math.exp(1000)\n"})
    assert text == ("Your code stopped with an OverflowError on line 3 of main.py:\n"
                    "    x = math.exp(1000)\n(OverflowError: math range error)")


def test_an_error_outside_the_learners_files_names_no_line():
    error = ErrorInfo("ZeroDivisionError", "division by zero", "test_main.py", 4)
    assert explain_error(error, "python").startswith("Your code stopped with a ZeroDivisionError.\n")


def test_output_without_an_error_gives_none():
    assert error_from_output("all fine\n", "python", {"main.py": ""}) is None
    assert error_from_output("all fine\n", "javascript", {"index.js": ""}) is None
