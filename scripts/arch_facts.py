"""Architecture facts for review: the import graph between packages, the largest files and
classes, and the test/code ratio per package (lines of code, blank lines and comments aside).

    python scripts/arch_facts.py [TREE]   (TREE: another checkout, e.g. a `git worktree` of an older commit)
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
PACKAGES = ["ide_server", "collab", "sandbox", "deploy_service", "tutorials", "assistant", "llm_engine"]


def _code_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))


def _sources(package: str) -> list[Path]:
    return [p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts]


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Import statements, those under `if TYPE_CHECKING:` aside (they name types; nothing loads)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, dict[str, tuple[int, int]]]:
    """package -> {imported package: (import statements run at import or call time, distinct modules named)}."""
    statements: dict[str, dict[str, int]] = {p: defaultdict(int) for p in PACKAGES if (ROOT / p).is_dir()}
    modules: dict[str, dict[str, set[str]]] = {p: defaultdict(set) for p in statements}
    for package in statements:
        for path in _sources(package):
            for node in _runtime_imports(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                for name in names:
                    top = name.split(".")[0]
                    if top in statements and top != package:
                        statements[package][top] += 1
                        modules[package][top].add(name)
    return {p: {d: (n, len(modules[p][d])) for d, n in deps.items()} for p, deps in statements.items()}


def largest(n: int = 10) -> tuple[list[tuple[int, str]], list[tuple[int, int, str]]]:
    files, classes = [], []
    for package in PACKAGES:
        for path in _sources(package) if (ROOT / package).is_dir() else []:
            rel = str(path.relative_to(ROOT))
            files.append((_code_lines(path), rel))
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    methods = sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) for b in node.body)
                    classes.append((node.end_lineno - node.lineno + 1, methods, f"{rel}:{node.name}"))
    return sorted(files, reverse=True)[:n], sorted(classes, reverse=True)[:n]


def ratios() -> dict[str, tuple[int, int]]:
    """package -> (code lines, test lines); tests/<dir> count for the package they are named after."""
    test_dirs = {"ide_server": ["ide_server"], "collab": ["collab"], "sandbox": ["sandbox", "sandbox_api", "sandbox_packages"],
                 "deploy_service": ["deploy"], "tutorials": ["tutorials"], "assistant": ["ide_assistant"],
                 "llm_engine": ["llm_engine", "llm_serving"]}
    out = {}
    for package, dirs in test_dirs.items():
        if not (ROOT / package).is_dir():
            continue
        code = sum(_code_lines(p) for p in _sources(package))
        tests = sum(_code_lines(p) for d in dirs for p in (ROOT / "tests" / d).rglob("*.py"))
        out[package] = (code, tests)
    return out


def main() -> None:
    print("## Imports between packages (statements/distinct modules)")
    for package, deps in import_graph().items():
        edges = ", ".join(f"{d} ({n}/{m})" for d, (n, m) in sorted(deps.items()))
        print(f"{package:15} -> {edges or '(none)'}")
    files, classes = largest()
    print("\n## Largest files (code lines)")
    for lines, name in files:
        print(f"{lines:5}  {name}")
    print("\n## Largest classes (lines, methods)")
    for lines, methods, name in classes:
        print(f"{lines:5} {methods:3}  {name}")
    print("\n## Test/code ratio (code lines)")
    total_code = total_tests = 0
    for package, (code, tests) in ratios().items():
        total_code, total_tests = total_code + code, total_tests + tests
        print(f"{package:15} {code:6} {tests:6}  {tests / code:.2f}")
    print(f"{'all':15} {total_code:6} {total_tests:6}  {total_tests / total_code:.2f}")


if __name__ == "__main__":
    main()
