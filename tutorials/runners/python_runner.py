"""Codeyard's lesson test runner for Python; runs inside the sandbox, standard library only.

    python3 -I -B .codeyard-check/python_runner.py .codeyard-check/spec.json

It reads the spec (test files and input/output checks, in grading order), deletes its folder before any learner code
runs (so hidden tests can't be read from disk), runs pytest-style test files (plain asserts,
`pytest.raises`, `pytest.mark.task`, `pytest.mark.parametrize`, through a small stand-in `pytest`
module) and the input/output checks, each with its own timeout and captured output, and prints one
JSON line after the spec's marker on the original stdout.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any

WORKSPACE = os.getcwd()
TEXT_LIMIT = 2000
# The spec and the report are JSON; a mark is pytest's (name, args, kwargs); a test is
# (name, the call that runs it, its marks, its source).
Json = dict[str, Any]
Mark = tuple[str, tuple[Any, ...], dict[str, Any]]
Test = tuple[str, Callable[[], Any], list[Mark], str]


class Timeout(BaseException):
    """Raised by the alarm; a BaseException so a learner's `except Exception` can't swallow it."""


class CheckFailed(AssertionError):
    """A failed assert, with what was compared."""

    def __init__(self, **details: Any) -> None:
        super().__init__(details.get("note") or "check failed")
        self.details = details


def _repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:297] + "..."


_OP_WORDS = {"Eq": ("==", "to be"), "NotEq": ("!=", "not to be"), "Lt": ("<", "to be less than"),
             "LtE": ("<=", "to be at most"), "Gt": (">", "to be greater than"), "GtE": (">=", "to be at least"),
             "Is": ("is", "to be"), "IsNot": ("is not", "not to be"), "In": ("in", "to contain"),
             "NotIn": ("not in", "not to contain")}
_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "Eq": lambda a, b: a == b, "NotEq": lambda a, b: a != b, "Lt": lambda a, b: a < b, "LtE": lambda a, b: a <= b,
    "Gt": lambda a, b: a > b, "GtE": lambda a, b: a >= b, "Is": lambda a, b: a is b, "IsNot": lambda a, b: a is not b,
    "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b}


def _compare(left: Any, right: Any, op: str, left_text: str, right_text: str, note: object) -> None:
    if _OPS[op](left, right):
        return
    symbol, words = _OP_WORDS[op]
    if op in ("In", "NotIn"):  # "expected <container> to contain <item>"
        raise CheckFailed(kind="compare", op=symbol, op_words=words, expression=right_text, expected=_repr(left),
                          actual=_repr(right), note=note)
    raise CheckFailed(kind="compare", op=symbol, op_words=words, expression=left_text, expected=_repr(right),
                      actual=_repr(left), note=note)


def _truth(value: object, text: str, note: object) -> None:
    if not value:
        raise CheckFailed(kind="truth", expression=text, note=note)


class _RewriteAsserts(ast.NodeTransformer):
    """`assert a == b, msg` -> `__codeyard_compare__(a, b, "Eq", "a", "b", msg)`: pytest-like messages."""

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        note = node.msg or ast.Constant(None)
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]).__name__ in _OPS:
            args = [test.left, test.comparators[0], ast.Constant(type(test.ops[0]).__name__),
                    ast.Constant(ast.unparse(test.left)), ast.Constant(ast.unparse(test.comparators[0])), note]
            call = ast.Call(ast.Name("__codeyard_compare__", ast.Load()), args, [])
        else:
            call = ast.Call(ast.Name("__codeyard_truth__", ast.Load()), [test, ast.Constant(ast.unparse(test)), note], [])
        return ast.fix_missing_locations(ast.copy_location(ast.Expr(call), node))


# --- a stand-in for the parts of pytest lesson tests use ---------------------------------------

class raises:
    def __init__(self, expected: type[BaseException] | tuple[type[BaseException], ...], match: str | None = None) -> None:
        self.expected, self.match = expected, match
        self.value: BaseException | None = None

    def __enter__(self) -> raises:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: object) -> bool:
        name = getattr(self.expected, "__name__", str(self.expected))
        if kind is None:
            raise CheckFailed(kind="raises", note=f"Expected a {name} to be raised, but no error happened.")
        if not issubclass(kind, self.expected):
            return False
        if self.match is not None and not re.search(self.match, str(value)):
            raise CheckFailed(kind="raises", note=f"A {name} was raised, but its message {str(value)!r} should match {self.match!r}.")
        self.value = value
        return True


def fail(message: str = "") -> None:
    raise CheckFailed(kind="truth", note=message or "failed")


class _Marks:
    """pytest.mark.NAME(...) records (NAME, args, kwargs) on the function."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def mark(*args: Any, **kwargs: Any) -> Any:
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return _add_mark(args[0], name, (), {})
            return lambda fn: _add_mark(fn, name, args, kwargs)
        return mark


def _add_mark(fn: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    fn.__dict__.setdefault("codeyard_marks", []).append((name, args, kwargs))
    return fn


def _pytest_module() -> types.ModuleType:
    module = types.ModuleType("pytest")
    module.__dict__.update(raises=raises, fail=fail, mark=_Marks())
    return module


# --- locating errors ----------------------------------------------------------------------------

def _learner_path(path: str, test_files: set[str]) -> str | None:
    if not path or not path.startswith(WORKSPACE + os.sep):
        return None
    relative = os.path.relpath(path, WORKSPACE)
    return relative if relative not in test_files and os.path.isfile(path) else None


def error_info(exc: BaseException, test_files: set[str], sources: dict[str, str]) -> Json:
    """The exception as the host's ErrorInfo: type, message, and the learner's line where possible."""
    info: Json = {"type": type(exc).__name__, "message": str(exc), "in_learner_file": False}
    if isinstance(exc, SyntaxError):
        info["message"] = exc.msg
        relative = _learner_path(exc.filename or "", test_files)
        info.update(file=relative or os.path.relpath(exc.filename or "?", WORKSPACE), line=exc.lineno,
                    column=exc.offset, code=(exc.text or "").rstrip("\n") or None, in_learner_file=relative is not None)
        return info
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()  # includes 3.11's "Did you mean"
    if last.startswith(info["type"] + ": "):
        info["message"] = last[len(info["type"]) + 2:]
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        relative = _learner_path(frame.filename, test_files)
        if relative is not None:
            info.update(file=relative, line=frame.lineno, code=frame.line, in_learner_file=True)
            return info
    for frame in reversed(frames):
        relative = os.path.relpath(frame.filename, WORKSPACE)
        if relative in sources:
            lines = sources[relative].splitlines()
            info.update(file=relative, line=frame.lineno,
                        code=lines[frame.lineno - 1] if frame.lineno and 0 < frame.lineno <= len(lines) else None)
            break
    return info


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise Timeout()
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def captured() -> Iterator[io.StringIO]:
    """Output (stdout and stderr) of learner code during one test; input() finds nothing to read."""
    buffer = io.StringIO()
    stdin = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        sys.stdin = stdin


# --- unit tests ---------------------------------------------------------------------------------

def load_test_file(test: Json, test_files: set[str], sources: dict[str, str],
                   timeout: float) -> tuple[types.ModuleType, None] | tuple[None, Json]:
    """Exec a test file from its in-memory source; returns (module, None) or (None, load error)."""
    name = test["file"]
    module = types.ModuleType(re.sub(r"\W", "_", name[:-3]))
    module.__file__ = os.path.join(WORKSPACE, name)
    module.__dict__.update(__codeyard_compare__=_compare, __codeyard_truth__=_truth)
    sys.modules[module.__name__] = module  # a later test file may import helpers from an earlier one
    try:
        tree = _RewriteAsserts().visit(ast.parse(test["source"], module.__file__))
        code = compile(tree, module.__file__, "exec", dont_inherit=True)
        with captured(), time_limit(timeout):
            exec(code, module.__dict__)
    except Timeout:
        return None, {"type": "Timeout", "message": f"loading took longer than {timeout:g} s", "in_learner_file": False,
                      "test_file": name}
    except BaseException as exc:  # the learner's module failed to import (syntax error, crash at load)
        return None, {**error_info(exc, test_files, sources), "test_file": name}
    return module, None


def _test_code(source: str, name: str) -> str:
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "\n".join(source.splitlines()[first - 1:node.end_lineno])
    return ""


def collect(module: types.ModuleType, source: str, hidden: bool) -> list[Test]:
    """(name, callable, marks, test code) for each test, in the order the file defines them."""
    tests: list[Test] = []
    for name, value in list(vars(module).items()):
        if name.startswith("test") and isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            tests += _expand(name, value, getattr(value, "codeyard_marks", []), _test_code(source, name), hidden)
        elif name.startswith("Test") and isinstance(value, type):
            code = _test_code(source, name)
            for method_name, method in vars(value).items():
                if method_name.startswith("test") and callable(method):
                    bound = (lambda cls, m: lambda *a, **k: getattr(cls(), m)(*a, **k))(value, method_name)
                    marks = getattr(value, "codeyard_marks", []) + getattr(method, "codeyard_marks", [])
                    tests += _expand(f"{name}.{method_name}", bound, marks, code, hidden)
    return tests


def _expand(name: str, fn: Callable[..., Any], marks: list[Mark], code: str, hidden: bool) -> list[Test]:
    """One test per parametrize case, named by its values (by its number in a hidden test: values are secret)."""
    for mark, args, _kwargs in marks:
        if mark == "parametrize":
            names = args[0] if isinstance(args[0], (list, tuple)) else [n.strip() for n in args[0].split(",")]
            cases: list[Test] = []
            for number, values in enumerate(args[1], start=1):
                values = values if len(names) > 1 else (values,)
                label = str(number) if hidden else "-".join(_repr(v) for v in values)
                cases.append((f"{name}[{label}]", (lambda v: lambda: fn(**dict(zip(names, v))))(values), marks, code))
            return cases
    return [(name, fn, marks, code)]


def _task(marks: list[Mark], single_task: object) -> Any:
    for mark, args, kwargs in marks:
        if mark == "task":
            return kwargs.get("taskno", args[0] if args else None)
    return single_task


def run_test(name: str, fn: Callable[[], Any], marks: list[Mark], code: str, test: Json, spec: Json,
             test_files: set[str], sources: dict[str, str]) -> Json:
    result: Json = {"name": name, "file": test["file"], "hidden": test["hidden"], "task": _task(marks, spec["single_task"]),
              "status": "pass", "test_code": code}
    with captured() as output:
        try:
            with time_limit(spec["timeout"]):
                returned = fn()
                if inspect.iscoroutine(returned):  # an `async def` test
                    import asyncio
                    asyncio.run(returned)
        except Timeout:
            result.update(status="error", kind="timeout")
        except CheckFailed as exc:
            result.update(status="fail", **exc.details)
        except AssertionError as exc:
            result.update(status="fail", kind="truth", note=str(exc) or None)
        except BaseException as exc:  # an error in the learner's code (or the test): explained by the host
            result.update(status="error", kind="error", error=error_info(exc, test_files, sources))
    result["output"] = output.getvalue()[:TEXT_LIMIT]
    return result


# --- input/output checks ------------------------------------------------------------------------

def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").rstrip().split("\n"))


def run_io(check: Json, spec: Json) -> Json:
    result: Json = {"name": check["name"], "hidden": check["hidden"], "task": check["task"] or spec["single_task"], "status": "pass",
              "kind": "io", "stdin": check["stdin"], "stdout_regex": check["stdout_regex"]}
    argv = [sys.executable, "-B", os.path.join(".", spec["entry"])]
    try:
        proc = subprocess.run(argv, input=check["stdin"], capture_output=True, text=True, timeout=spec["timeout"], cwd=WORKSPACE)
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode("utf-8", "replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {**result, "status": "error", "kind": "timeout", "output": output[:TEXT_LIMIT]}
    result["output"] = proc.stdout[:TEXT_LIMIT]
    if proc.returncode != 0:
        return {**result, "status": "error", "kind": "error", "stderr": proc.stderr[-TEXT_LIMIT:]}
    if check["stdout_regex"] is not None:
        passed = re.search(check["stdout_regex"], proc.stdout, re.MULTILINE) is not None
        expected = check["stdout_regex"]
    else:
        passed = _normalise(proc.stdout) == _normalise(check["stdout"])
        expected = check["stdout"].rstrip()
    if not passed:
        result.update(status="fail", expected=expected, actual=proc.stdout.rstrip()[:TEXT_LIMIT])
    return result


def main(spec_path: str) -> None:
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    shutil.rmtree(os.path.dirname(os.path.abspath(spec_path)))  # gone before any learner code runs
    report = sys.stdout
    sys.path.insert(0, WORKSPACE)
    sys.modules["pytest"] = _pytest_module()
    sources = {c["file"]: c["source"] for c in spec["checks"] if c["kind"] == "file"}
    test_files = set(sources)
    results: list[Json] = []
    for check in spec["checks"]:
        if check["kind"] == "io":
            results.append(run_io(check, spec))
            continue
        module, error = load_test_file(check, test_files, sources, spec["timeout"])
        if module is None:  # (then there is its load error)
            report.write(f"\n{spec['marker']} {json.dumps({'load_error': error, 'load_error_hidden': check['hidden']})}\n")
            return
        for name, fn, marks, code in collect(module, check["source"], check["hidden"]):
            results.append(run_test(name, fn, marks, code, check, spec, test_files, sources))
    report.write(f"\n{spec['marker']} {json.dumps({'tests': results})}\n")


if __name__ == "__main__":
    main(sys.argv[1])
