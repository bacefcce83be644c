"""Backend choice: `auto` takes Docker where an engine answers, else bubblewrap, else refuses clearly."""

from __future__ import annotations

import pytest

from sandbox.backends.choice import make_backend
from sandbox.errors import SandboxUnavailable


async def test_auto_prefers_docker(runner_image):
    backend = make_backend("auto", pool_size=1)
    assert backend.name == "docker" and backend.pool_size == 1
    await backend.close()


def test_auto_falls_back_to_bwrap_without_an_engine(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    assert make_backend("auto").name == "bwrap"


def test_no_sandbox_means_no_running(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    with pytest.raises(SandboxUnavailable, match="install Docker .* or bubblewrap .*never runs code unsandboxed"):
        make_backend("auto")


def test_unknown_backend_name():
    with pytest.raises(ValueError, match="sandbox backend must be auto, docker, bwrap or runners"):
        make_backend("none")
