"""The gates of `make lint` fail on a planted violation and pass without it: ruff (an unused import),
the import contracts (llm_engine importing ide_server, a package importing another's routes or a module behind
the sandbox's face), mypy
(a type error). Each runs the real tool with the repository's own configuration (pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PACKAGES = ["ide_server", "collab", "sandbox", "deploy_service", "tutorials", "assistant", "llm_engine"]


def _run(tool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / tool), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd), "HOME": str(cwd)})


def _config(tmp: Path) -> None:
    shutil.copy(REPO / "pyproject.toml", tmp / "pyproject.toml")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the packages' Python sources (what the import contracts read), with the config."""
    tmp = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp / package, ignore=lambda folder, names: [
            n for n in names if not n.endswith(".py") and not (Path(folder) / n).is_dir() or n == "__pycache__"])
    _config(tmp)
    return tmp


def test_ruff_fails_on_an_unused_import(tmp_path: Path) -> None:
    _config(tmp_path)
    (tmp_path / "clean.py").write_text('"""A module."""\n\nimport os\n\nprint(os.sep)\n')
    assert _run("ruff", "check", ".", cwd=tmp_path).returncode == 0
    (tmp_path / "planted.py").write_text('"""A module."""\n\nimport os\n')
    result = _run("ruff", "check", ".", cwd=tmp_path)
    assert result.returncode == 1 and "F401" in result.stdout and "planted.py" in result.stdout


@pytest.mark.parametrize(("path", "code", "contract"), [
    ("llm_engine/planted.py", "from ide_server import models\n", "llm_engine is a library"),
    ("tutorials/planted.py", "from sandbox import api\n", "sandbox's route module is its own"),
    ("deploy_service/planted.py", "from sandbox.limits import MIB\n", "the sandbox through its face"),
    ("ide_server/planted.py", "import tutorials.service\n", "packages form layers"),
    ("sandbox/planted_a.py", "from sandbox import planted_b\n", "no import cycle"),
])
def test_import_contracts_fail_on_a_planted_import(sources: Path, path: str, code: str, contract: str) -> None:
    assert _run("lint-imports", cwd=sources).returncode == 0
    planted = [sources / path]
    (sources / path).write_text(code)
    if "planted_a" in path:  # the other half of the cycle
        planted.append(sources / "sandbox/planted_b.py")
        planted[1].write_text("from sandbox import planted_a\n")
    try:
        result = _run("lint-imports", cwd=sources)
    finally:
        for file in planted:
            file.unlink()
    assert result.returncode == 1
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout[-3000:]


def test_mypy_fails_on_a_type_error(tmp_path: Path) -> None:
    _config(tmp_path)
    (tmp_path / "assistant").mkdir()
    (tmp_path / "assistant/__init__.py").write_text("")
    (tmp_path / "assistant/planted.py").write_text("def double(n: int) -> int:\n    return n * 2\n")
    args = ("--cache-dir", str(tmp_path / ".mypy_cache"), "-p", "assistant")
    assert _run("mypy", *args, cwd=tmp_path).returncode == 0
    (tmp_path / "assistant/planted.py").write_text('def double(n: int) -> int:\n    return n * 2\n\n\ndouble("2")\n')
    result = _run("mypy", *args, cwd=tmp_path)
    assert result.returncode == 1 and "arg-type" in result.stdout, result.stdout
