"""Cancelling a run while its packages install stops the install too, leaving nothing behind."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

from sandbox_fixtures import make_spec

from sandbox.backends.bwrap import BwrapBackend
from sandbox.packages.first import PackagesFirst
from sandbox.packages.install import Installer

from .test_hostile_install import sdist


async def test_cancel_during_install(packages_root, project):
    wheelhouse = Path(tempfile.mkdtemp(prefix="codeyard-wheelhouse-"))
    os.chmod(wheelhouse, 0o755)
    try:
        sdist(wheelhouse, "slow", "import time\ntime.sleep(120)\n")
        installer = Installer(BwrapBackend(), packages_root / "cancel", index_url=None, find_links=wheelhouse)
        (project / "requirements.txt").write_text("slow\n")
        (project / "main.py").write_text("print('never')\n")
        run = await PackagesFirst(BwrapBackend(), installer).start(make_spec(project, ["python3", "main.py"]))
        chunks = run.chunks()
        first = await asyncio.wait_for(anext(chunks), 30)
        assert first.stream == "install"
        run.cancel()
        result = await asyncio.wait_for(run.result(), 10)
    finally:
        shutil.rmtree(wheelhouse)
    assert (result.verdict.value, result.stdout) == ("cancelled", b"")
    assert list(installer.envs.iterdir()) == []
