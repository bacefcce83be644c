"""Friendly explanations of errors for beginners, pointing at the line of *their* code.

The tutorials' grader and the assistant's "Explain this error" both give them, so they live with the
runs whose output they read.

futurecoder-style: the raw error ("NameError: name 'pritn' is not defined") becomes what it means
and what to try, with the learner's line quoted. Errors arrive either structured (from the
in-sandbox runner) or as the text a crashed program left on stderr (a Python traceback, Node's
uncaught-error report); both become one `ErrorInfo`.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

WORKSPACE = "/workspace/"


@dataclass
class ErrorInfo:
    """An exception, located in the learner's files where possible (file is workspace-relative)."""

    type: str
    message: str
    file: str | None = None
    line: int | None = None
    column: int | None = None
    code: str | None = None  # the source line, as the learner wrote it
    in_learner_file: bool = False  # False: the location is in a test, or unknown
    test_file: str | None = None  # set when the error happened while loading this test file

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ErrorInfo:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


def explain_error(error: ErrorInfo, language: str, files: Mapping[str, str] | None = None) -> str:
    """What went wrong, where, and what to try, in a few plain lines, ending with the raw error."""
    table = _PYTHON if language == "python" else _JAVASCRIPT
    advice = next((text(match) for kind, pattern, text in table
                   if kind == error.type and (match := re.search(pattern, error.message))), None)
    if error.in_learner_file and error.file and error.line:
        code = error.code or _source_line(files or {}, error.file, error.line)
        where = f"{_headline(error.type)} on line {error.line} of {error.file}" + (f":\n    {code.strip()}" if code else ".")
    else:
        where = f"{_headline(error.type)}."
    return "\n".join(part for part in (where, advice, f"({error.type}: {error.message})") if part)


def error_from_output(text: str, language: str, files: Mapping[str, str]) -> ErrorInfo | None:
    """The error a crashed program reported on stderr, or None if the text holds none."""
    return _from_traceback(text, files) if language == "python" else _from_node_report(text, files)


def _headline(error_type: str) -> str:
    if error_type in ("SyntaxError", "IndentationError", "TabError"):
        return "Your code could not be read"
    return f"Your code stopped with {_a(error_type)}"


def _a(noun: str) -> str:
    """The noun with its indefinite article: "an int", "a str", "an IndexError"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _source_line(files: Mapping[str, str], name: str, line: int) -> str | None:
    lines = files.get(name, "").splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else None


def _relative(path: str) -> str:
    path = posixpath.normpath(path)
    return path[len(WORKSPACE):] if path.startswith(WORKSPACE) else path


_PY_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_PY_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)|StopIteration|KeyboardInterrupt)(?::\s?(.*))?$")


def _from_traceback(text: str, files: Mapping[str, str]) -> ErrorInfo | None:
    lines = text.rstrip().splitlines()
    exc_index = next((i for i in range(len(lines) - 1, -1, -1) if _PY_EXCEPTION.match(lines[i])), None)
    if exc_index is None:
        return None
    match = _PY_EXCEPTION.match(lines[exc_index])
    assert match is not None  # (exc_index is a line it matches)
    error = ErrorInfo(type=match.group(1).rsplit(".", 1)[-1], message=(match.group(2) or "").strip())
    for line in lines[:exc_index]:
        frame = _PY_FRAME.match(line)
        if frame and _relative(frame.group(1)) in files:
            error.file, error.line, error.in_learner_file = _relative(frame.group(1)), int(frame.group(2)), True
    if error.file and error.line:
        error.code = _source_line(files, error.file, error.line)
    return error


_NODE_HEADER = re.compile(r"^(/\S+|\./\S+):(\d+)$")
_NODE_FRAME = re.compile(r"\(?((?:/|\./)[^\s()]+):(\d+):(\d+)\)?$")
_NODE_EXCEPTION = re.compile(r"^(?:Uncaught )?([A-Z]\w*Error)(?: \[\w+\])?: (.*)$")


def _from_node_report(text: str, files: Mapping[str, str]) -> ErrorInfo | None:
    lines = text.splitlines()
    exc = next((m for line in lines if (m := _NODE_EXCEPTION.match(line.strip()))), None)
    if exc is None:
        return None
    error = ErrorInfo(type=exc.group(1), message=exc.group(2).strip())
    for line in lines:
        header = _NODE_HEADER.match(line.strip())
        frame = _NODE_FRAME.search(line.strip()) if line.strip().startswith("at ") else None
        found = header or frame
        if found and _relative(found.group(1)) in files:
            error.file, error.line, error.in_learner_file = _relative(found.group(1)), int(found.group(2)), True
            error.column = int(frame.group(3)) if frame else None
            break
    if error.file and error.line:
        error.code = _source_line(files, error.file, error.line)
    return error


# (exception type, pattern searched in its message, advice): the first match wins.
Advice = list[tuple[str, str, Callable[[re.Match[str]], str]]]
_PYTHON: Advice = [
    ("IndentationError", r"expected an indented block", lambda m: (
        "Python expected the lines after a ':' (if, for, while, def, class) to be indented. "
        "Put 4 spaces at the start of each line that belongs inside.")),
    ("IndentationError", r"unexpected indent", lambda m: (
        "This line starts with spaces it shouldn't have. Lines only move right after a line ending in ':'.")),
    ("IndentationError", r"unindent does not match", lambda m: (
        "This line's spaces don't line up with any line above. Lines in the same block need exactly the same indentation.")),
    ("TabError", r".*", lambda m: "Tabs and spaces are mixed in the indentation. Use 4 spaces everywhere."),
    ("SyntaxError", r"unterminated string literal|EOL while scanning", lambda m: (
        "A piece of text is missing its closing quote. Text starts and ends with the same quote: \"like this\".")),
    ("SyntaxError", r"'(.)' was never closed", lambda m: (
        f"A '{m.group(1)}' is opened but never closed. Count the brackets on this line: each opening one needs a closing one.")),
    ("SyntaxError", r"expected ':'", lambda m: (
        "A ':' is missing at the end of this line. Lines starting with if, elif, else, for, while, def and class end with ':'.")),
    ("SyntaxError", r"invalid syntax. Maybe you meant '==' or ':=' instead of '='", lambda m: (
        "To compare two values use '==' (two equals signs). A single '=' puts a value into a variable.")),
    ("SyntaxError", r"Perhaps you forgot a comma", lambda m: (
        "Two values stand next to each other without anything between them. Did you forget a comma, a '+' or quotes?")),
    ("SyntaxError", r"Missing parentheses in call to 'print'", lambda m: (
        "In Python 3, print is a function: write print(\"hello\") with brackets.")),
    ("SyntaxError", r".*", lambda m: (
        "Python could not understand this line. Look for a missing ':', bracket or quote here or on the line just before.")),
    ("NameError", r"name '(\w+)' is not defined. Did you mean: '(\w+)'", lambda m: (
        f"Python doesn't know the name '{m.group(1)}'. Did you mean '{m.group(2)}'? Spelling and capital letters matter.")),
    ("NameError", r"name '(\w+)' is not defined", lambda m: (
        f"Python doesn't know the name '{m.group(1)}'. Check the spelling (capitals matter), give it a value before "
        "this line, or put it in quotes if you meant text.")),
    ("UnboundLocalError", r"'?(\w+)'?", lambda m: (
        f"'{m.group(1)}' is used inside a function before it gets a value there. Give it a value first, or pass it in as a parameter.")),
    ("TypeError", r'can only concatenate str \(not "(\w+)"\) to str', lambda m: (
        f"You joined text and {_a(m.group(1))} with '+'. Turn the value into text first, with str(...), "
        "or use an f-string: f\"Age: {age}\".")),
    ("TypeError", r"unsupported operand type\(s\) for (\S+): '(\w+)' and '(\w+)'", lambda m: (
        f"'{m.group(1)}' can't combine {_a(m.group(2))} and {_a(m.group(3))}. Convert one of them first, "
        "for example int(text) to turn digits typed by a user into a number.")),
    ("TypeError", r"(\w+)\(\) missing (\d+) required positional argument", lambda m: (
        f"{m.group(1)}() was called with too few values: it needs {m.group(2)} more. Compare the call with the 'def' line.")),
    ("TypeError", r"(\w+)\(\) takes (\d+) positional arguments? but (\d+) (?:was|were) given", lambda m: (
        f"{m.group(1)}() takes {m.group(2)} value(s) but got {m.group(3)}. Compare the call with the 'def' line "
        "(inside a class, remember 'self').")),
    ("TypeError", r"(\w+)\(\) takes no arguments", lambda m: (
        f"{m.group(1)}() was given values but takes none. For a class, the values go to __init__: "
        "def __init__(self, ...) inside the class.")),
    ("TypeError", r"'NoneType' object", lambda m: (
        "A value is None here. A function without 'return' gives back None: did you print a result instead of returning it?")),
    ("TypeError", r"'(\w+)' object is not callable", lambda m: (
        f"A {m.group(1)} was used like a function, with brackets after it. Did a variable take the name of a function?")),
    ("TypeError", r"'(\w+)' object is not subscriptable", lambda m: (
        f"Square brackets [] were used on a {m.group(1)}, which has no items to pick from.")),
    ("TypeError", r".*", lambda m: "A value of the wrong type was used here. Check what each value is (text, number, list...)."),
    ("IndexError", r".*", lambda m: (
        "You asked for a position the list (or text) doesn't have. Positions start at 0: a list of 3 items has "
        "positions 0, 1 and 2. len(...) tells you how many there are.")),
    ("KeyError", r"(.*)", lambda m: (
        f"The dictionary has no key {m.group(1)}. Check the spelling, add the key first, or use .get(key) "
        "to get None instead of an error.")),
    ("ZeroDivisionError", r".*", lambda m: "Something was divided by zero, which has no answer. Check the divisor isn't 0 first."),
    ("AttributeError", r"module '(\w+)' has no attribute '(\w+)'", lambda m: (
        f"The tests look for '{m.group(2)}' in {m.group(1)}.py, but it isn't there. Check that you created it, with "
        "this exact name (capitals matter), at the left edge of the file rather than inside an if or a function.")),
    ("AttributeError", r"'NoneType' object has no attribute '(\w+)'", lambda m: (
        f"You used .{m.group(1)} on None. A function without 'return' gives back None: did you forget a return?")),
    ("AttributeError", r"'(\w+)' object has no attribute '(\w+)'. Did you mean: '(\w+)'", lambda m: (
        f"A {m.group(1)} has no '{m.group(2)}'. Did you mean '{m.group(3)}'?")),
    ("AttributeError", r"'(\w+)' object has no attribute '(\w+)'", lambda m: (
        f"A {m.group(1)} has no '{m.group(2)}'. Check the spelling, and which kind of value this is.")),
    ("ValueError", r"invalid literal for int\(\) with base 10: (.*)", lambda m: (
        f"int() can only turn whole numbers written in digits into a number, not {m.group(1)}.")),
    ("ValueError", r"could not convert string to float: (.*)", lambda m: f"float() can't turn {m.group(1)} into a number."),
    ("ValueError", r".*", lambda m: "A value had the right type but a content that doesn't work here."),
    ("EOFError", r".*", lambda m: (
        "Your code called input(), but there was nothing (more) to read. The tests call your functions directly: "
        "take values as parameters instead of asking with input().")),
    ("SystemExit", r".*", lambda m: (
        "Your code called exit() (or sys.exit()), which stops everything, the tests too. "
        "Remove it, or use return to leave a function.")),
    ("RecursionError", r".*", lambda m: "A function kept calling itself without end. It needs a case that returns without calling itself."),
    ("ImportError", r"cannot import name '(\w+)' from '([\w.]+)'", lambda m: (
        f"The tests look for '{m.group(1)}' in {m.group(2).replace('.', '/')}.py, but it isn't there. Check the name "
        "(spelling and capitals) and that its 'def' line starts at the left edge.")),
    ("ModuleNotFoundError", r"No module named '([\w.]+)'", lambda m: f"There is no module called '{m.group(1)}' here. Check the spelling."),
    ("FileNotFoundError", r"No such file or directory: (.*)", lambda m: f"There is no file {m.group(1)}. Check the name and folder."),
]

_JAVASCRIPT: Advice = [
    ("ReferenceError", r"(\S+) is not defined", lambda m: (
        f"JavaScript doesn't know '{m.group(1)}'. Check the spelling (capitals matter), and declare it with let or "
        "const before using it, or put it in quotes if you meant text.")),
    ("ReferenceError", r"Cannot access '(\w+)' before initialization", lambda m: (
        f"'{m.group(1)}' is used before the line that declares it. Move the let/const line above.")),
    ("TypeError", r"Cannot read propert(?:y|ies) of (undefined|null) \(reading '([^']+)'\)", lambda m: (
        f"You asked for .{m.group(2)} of something that is {m.group(1)}. Is a variable missing its value, "
        "or did a function forget to return?")),
    ("TypeError", r"(\S+) is not a function", lambda m: (
        f"{m.group(1)} was called like a function but isn't one. Check the spelling, and that it was exported and imported.")),
    ("TypeError", r"Assignment to constant variable", lambda m: (
        "A const can't be given a new value. Declare it with let if it must change.")),
    ("TypeError", r".*", lambda m: "A value of the wrong kind was used here. Check what each value is (text, number, array...)."),
    ("SyntaxError", r"missing \) after argument list", lambda m: "A ')' is missing: a function call opened a bracket and never closed it."),
    ("SyntaxError", r"Unexpected end of input", lambda m: "The code ends too early: a '}', ')' or ']' is missing somewhere."),
    ("SyntaxError", r"Invalid or unexpected token", lambda m: (
        "There is a character JavaScript doesn't expect here, often a text missing its closing quote.")),
    ("SyntaxError", r"Identifier '(\w+)' has already been declared", lambda m: (
        f"'{m.group(1)}' is declared twice. Use let/const once, then just assign: {m.group(1)} = ...")),
    ("SyntaxError", r".*", lambda m: (
        "JavaScript could not understand this line. Look for a missing bracket, brace or quote here or just before.")),
    ("ProcessExit", r".*", lambda m: (
        "Your code called process.exit(), which would stop the tests too. Remove it, or use return to leave a function.")),
    ("RangeError", r"Maximum call stack size exceeded", lambda m: (
        "A function kept calling itself without end. It needs a case that returns without calling itself.")),
]
