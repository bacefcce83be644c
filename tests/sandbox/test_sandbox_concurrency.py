"""Many runs at once: each gets its own output and files, and nothing is left behind."""

from __future__ import annotations

import asyncio

from conftest import make_spec

from sandbox.verdict import Verdict


async def test_fifty_concurrent_runs(backend, tmp_path):
    projects = []
    for i in range(50):
        project = tmp_path / f"p{i}"
        project.mkdir()
        (project / "main.py").write_text(f"import time\ntime.sleep(0.2)\nprint({i} * 2)\nopen('out.txt', 'w').write('{i}')\n")
        projects.append(project)
    results = await asyncio.gather(
        *(backend.run(make_spec(p, ["python3", "main.py"], wall_seconds=60, cpu_seconds=10)) for p in projects)
    )
    for i, (project, result) in enumerate(zip(projects, results)):
        assert result.verdict == Verdict.OK, (i, result)
        assert result.stdout == f"{i * 2}\n".encode()
        assert (project / "out.txt").read_text() == str(i)
