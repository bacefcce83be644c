"""A deployment's log stays bounded on disk (rotated once) and keeps its newest entries."""

from __future__ import annotations

from deploy_service.logs import MAX_FILE_BYTES, DeployLog


def test_the_log_rotates_and_keeps_the_newest_entries(tmp_path):
    log = DeployLog(tmp_path / "d.log")
    line = "x" * 1000 + "\n"
    for number in range(3 * MAX_FILE_BYTES // 1000):
        log.write("stdout", f"{number} {line}", "r1")
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["d.log", "d.log.1"]
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 2 * MAX_FILE_BYTES
    tail = log.tail(10)
    assert [e["data"].split()[0] for e in tail] == [str(n) for n in range(3 * MAX_FILE_BYTES // 1000 - 10, 3 * MAX_FILE_BYTES // 1000)]
    log.remove()
    assert list(tmp_path.iterdir()) == []
