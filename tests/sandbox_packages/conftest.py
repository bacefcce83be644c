"""The shared sandbox fixtures (a check after every test that runs left nothing behind), and a
packages folder the sandbox uids can reach, removed afterwards."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from sandbox_fixtures import *  # noqa: F401,F403
from sandbox_fixtures import TEST_LIMITS, leftovers, make_spec  # noqa: F401


@pytest.fixture(scope="module")
def packages_root() -> Path:
    """A packages_dir (envs and download cache) shared by a module's tests: one real install each."""
    root = Path(tempfile.mkdtemp(prefix="codeyard-packages-test-"))
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root)
