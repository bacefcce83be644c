"""`codeyard runner` and `codeyard images` refuse what they cannot work with in one line, exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CODEYARD = str(Path(sys.executable).with_name("codeyard"))


def codeyard(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("CODEYARD_REDIS_URL", "DOCKER_HOST")}
    return subprocess.run([CODEYARD, *args], env={**clean, **env}, capture_output=True, text=True, timeout=60)


def test_a_runner_needs_redis(tmp_path):
    done = codeyard("runner", CODEYARD_DATA_DIR=str(tmp_path))
    assert done.returncode == 2 and "a runner needs CODEYARD_REDIS_URL" in done.stderr
    done = codeyard("runner", "--check", CODEYARD_DATA_DIR=str(tmp_path),
                    CODEYARD_REDIS_URL=f"unix://{tmp_path}/nobody.sock", CODEYARD_SANDBOX_BACKEND="bwrap")
    assert done.returncode == 2 and "does not answer" in done.stderr and "Traceback" not in done.stderr
    done = codeyard("runner", CODEYARD_REDIS_URL="redis://127.0.0.1:1/0", CODEYARD_SANDBOX_BACKEND="runners")
    assert done.returncode == 2 and "a runner runs code itself" in done.stderr


def test_images_build_says_what_is_missing(tmp_path):
    done = codeyard("images", "build", "app", DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    assert done.returncode == 2 and "no Docker engine answers" in done.stderr
