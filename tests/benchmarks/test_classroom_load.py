"""The classroom load test, short: 30 students for 20 s on the embedded default (SQLite, bubblewrap).

Any error (a 5xx, a wrong answer, a lost save, a run without the right verdict), timeout, dropped
collab socket or error in the server's log fails it. Latency goals are the benchmark's business
(benchmarks/load_bench.py prints them); this only keeps the class working.
"""

from benchmarks import load_bench


def test_thirty_students_without_an_error_or_a_timeout() -> None:
    [step] = load_bench.main(["--users", "30", "--seconds", "20"])
    assert step["requests"] > 30 * 10
    assert step["ops"]["run_e2e"]["n"] > 0 and step["ops"]["keystroke"]["n"] > 0
    assert step["error_samples"] == [] and step["errors"] == 0
    assert step["timeouts_by_op"] == {}
    assert step["socket_drops"] == 0
    assert step["server_log_errors"] == []
