"""The benchmark framework (`python -m benchmarks`): workloads, every target on a real server, the
noise-aware comparison rule, and the HTML report as Chromium shows it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.__main__ import main as bench_main
from benchmarks.framework import gate_ab, report, results, runner
from benchmarks.framework.targets import Server
from benchmarks.framework.workloads import WORKLOADS, Corpus

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def test_rank_test_flags_a_shift_and_not_the_noise():
    rng = random.Random(1)
    base = [1.0 + rng.gauss(0, 0.03) for _ in range(10)]
    same = [1.0 + rng.gauss(0, 0.03) for _ in range(10)]
    slower = [0.8 + rng.gauss(0, 0.03) for _ in range(10)]
    assert results.compare_figure("k", "throughput_ratio", base, same, 0.05, 0.05).status == "same"
    verdict = results.compare_figure("k", "throughput_ratio", base, slower, 0.05, 0.05)
    assert verdict.status == "regression" and verdict.p < 0.001 and verdict.change == pytest.approx(-0.2, abs=0.05)
    assert results.compare_figure("k", "ttft_p50_ms", base, slower, 0.05, 0.05).status == "improvement"
    assert results.compare_figure("k", "throughput_ratio", base[:3], slower[:3], 0.05, 0.05).status == "noisy"
    # significant but small: not a regression (the minimum change guards against tiny real shifts)
    assert results.compare_figure("k", "throughput_ratio", base, [b - 0.02 for b in base], 0.05, 0.05).status == "same"
    assert results.mann_whitney_p([1, 2, 3, 4], [5, 6, 7, 8]) == pytest.approx(2 / 70)


def test_workloads_are_seeded_and_shaped(smollm_tokenizer):
    corpus = Corpus(smollm_tokenizer)
    for name, build in WORKLOADS.items():
        first, again = build(corpus, 3), build(corpus, 3)
        assert first.phases and all(p.items for p in first.phases), name
        assert [i.prompt for p in first.phases for i in p.items] == [i.prompt for p in again.phases for i in p.items]
    grid = WORKLOADS["grid"](corpus, 0, batch=(1, 2), input_len=64, output_len=8)
    assert [len(p.items) for p in grid.phases] == [1, 2]
    assert abs(len(smollm_tokenizer(grid.phases[0].items[0].prompt).input_ids) - 64) <= 4
    chat = WORKLOADS["chat"](corpus, 0, conversations=2, turns=3)
    prompts = [i.prompt for i in chat.phases[0].items]
    assert any(b.startswith(a) and b != a for a in prompts for b in prompts)  # turns resend the history


def test_the_burst_phase_is_several_bursts_in_shared_shuffled_orders(smollm_tokenizer):
    corpus = Corpus(smollm_tokenizer)
    one = WORKLOADS["poisson"](corpus, 5, rates=(2.0,), num_requests=6)
    three = WORKLOADS["poisson"](corpus, 5, rates=(2.0,), num_requests=6, bursts=3)
    assert three.settings["bursts"] == 3 and one.settings["bursts"] == 1
    assert three.phases[0] == one.phases[0]  # the rate phase is untouched
    [single] = one.phases[1].waves()
    waves = three.phases[1].waves()
    assert len(waves) == 3 and all(len(w) == 6 and all(i.at == 0.0 for i in w) for w in waves)
    assert [(i.prompt, i.max_tokens) for i in waves[0]] == [(i.prompt, i.max_tokens) for i in single]
    orders = [[single.index(dataclasses.replace(i, wave=0)) for i in wave] for wave in waves]
    assert all(sorted(order) == list(range(6)) for order in orders)  # the same requests each burst
    assert len({tuple(order) for order in orders}) == 3  # each sent in its own order
    again = WORKLOADS["poisson"](corpus, 5, rates=(2.0,), num_requests=6, bursts=3)
    assert again.phases[1].items == three.phases[1].items  # one order for every target
    with pytest.raises(ValueError, match="bursts"):
        WORKLOADS["poisson"](corpus, 5, num_requests=6, bursts=0)


class _Recorder:
    """A stand-in target: answers after `item.max_tokens` ms, counting what is in flight."""

    name = "recorder"

    def __init__(self) -> None:
        self.in_flight, self.sent, self.prepared, self.connections_opened = 0, [], [], 0
        self.cpu_reads = 0

    async def prepare(self, phase) -> None:
        self.prepared.append(len(phase.items))
        self.connections_opened += 1  # one connection opened outside the clock, before each wave

    async def send(self, item):
        from benchmarks.framework.targets import Sample

        self.sent.append((item.wave, self.in_flight))
        self.in_flight += 1
        start = time.perf_counter()
        await asyncio.sleep(item.max_tokens / 1000)
        self.in_flight -= 1
        return Sample(True, start, start + item.wave / 1000, time.perf_counter(), 1)  # TTFT: `wave` ms

    def cpu(self):
        self.cpu_reads += 1
        return (float(self.cpu_reads), 2.0 * self.cpu_reads, 0.0)

    def engine_ttft(self):
        return (0.001 * len(self.sent), len(self.sent))

    def probe(self):
        return 0, 0.0


def test_a_phase_sends_each_wave_when_the_previous_one_is_done():
    from benchmarks.framework.workloads import Item, Phase

    items = [Item("p", ms, 0.0, wave) for wave in range(3) for ms in (30, 5, 10)]
    target = _Recorder()
    started = time.perf_counter()
    run = asyncio.run(runner.run_phase(target, Phase("burst", items), probe_interval=0))
    assert len(run.samples) == 9 and all(s.ok for s in run.samples)
    # each wave went out all at once, and only when nothing of the previous one was in flight
    assert target.sent == [(w, n) for w in range(3) for n in range(3)]
    assert target.prepared == [3, 3, 3]  # the pool warmed before each wave, off the clock
    assert run.connections_opened == 0
    assert 0.09 <= run.duration <= time.perf_counter() - started
    assert run.cpu == (3.0, 6.0, 0.0)  # summed over the waves: 1 of engine CPU a wave here
    assert run.engine_ttft == pytest.approx((0.009, 9))
    assert runner.wave_ttft(run, Phase("burst", items)) == {"wave_ttft_p50_ms": [0.0, 1.0, 2.0]}
    assert runner.wave_ttft(run, Phase("burst", items[:3])) == {}  # one wave: the phase's own p50 says it


def test_each_request_is_stored_by_its_index_in_the_phase():
    from benchmarks.framework.targets import Sample

    samples = [Sample(True, 1.0, 1.25, 1.5, 6), Sample(False, 2.0, error="HTTP 503"), Sample(True, 3.0, 3.01, 3.2, 4)]
    assert results.per_request(samples) == [
        {"index": 0, "ttft_ms": 250.0, "e2e_ms": 500.0, "tokens": 6},
        {"index": 1, "error": "HTTP 503"},  # kept, so the indices stay the workload's
        {"index": 2, "ttft_ms": 10.0, "e2e_ms": 200.0, "tokens": 4}]


def test_a_grpc_piece_is_timed_when_tritonclient_hands_it_over():
    """The gRPC target's clock reads the time tritonclient's stream thread got a piece, not the
    later turn of the benchmark's own event loop (its queue hop, ~0.25 ms on an idle server)."""
    from benchmarks.framework.targets import Grpc, _Clock

    class Result:
        def get_response(self):
            return type("Response", (), {"id": "r1"})()

    async def main() -> tuple[float, float, float]:
        target = Grpc(server=None)  # type: ignore[arg-type]
        target.loop = asyncio.get_running_loop()
        target.pending["r1"] = pieces = asyncio.Queue()
        handed = threading.Thread(target=target._on_response, args=(Result(), None))
        before = time.perf_counter()
        handed.start()
        handed.join()
        time.sleep(0.05)  # the event loop is late to take it
        _, error, received = await pieces.get()
        assert error is None
        clock = _Clock()
        clock.piece(2, at=received)
        return before, received, clock.sample.first

    before, received, first = asyncio.run(main())
    assert before <= received == first < before + 0.05


@pytest.fixture(scope="module")
def bench_results(tiny_server, tiny_chat_model, smollm_tokenizer, tmp_path_factory) -> list[Path]:
    """A small grid through every target, as two 'commits' (the second a copy with a new commit id)."""
    corpus = Corpus(smollm_tokenizer)
    workload = WORKLOADS["grid"](corpus, 0, batch=(1, 3), input_len=24, output_len=6)
    server = Server(url=tiny_server.url, grpc=tiny_server.service.options.grpc_address)
    offline = {"model": str(tiny_chat_model), "max_num_seqs": 4, "num_kv_blocks": 32, "max_model_len": 256}
    result = asyncio.run(runner.run(workload, ["offline", "v1", "v2", "grpc"], 1, server, offline, 5000, 1000,
                                    log=lambda *_: None))
    folder = tmp_path_factory.mktemp("bench")
    first = folder / "a.json"
    results.save(result, first)
    later = json.loads(first.read_text())
    later["git"]["commit"] = "f" * 40
    later["created"] = "9999-01-01T00:00:00Z"
    second = folder / "b.json"
    second.write_text(json.dumps(later))
    return [first, second]


def test_every_target_answers_the_same_workload(bench_results):
    result = results.load(bench_results[0])
    assert result["git"]["commit"] and result["machine"]["id"] and result["settings"]["targets"]
    for target in ("offline", "v1", "v2", "grpc"):
        for phase in ("b1 in24 out6", "b3 in24 out6"):
            [run] = result["figures"][f"{target} / {phase}"]["runs"]
            assert run["failed"] == 0 and run["completed"] == int(phase[1])
            assert run["output_tokens_per_s"] > 0 and run["ttft_p50_ms"] > 0 and run["tpot_p50_ms"] > 0
            # TTFT split at the engine's own timestamps: its part, and what the path around it adds
            assert 0 < run["engine_ttft_mean_ms"] <= run["ttft_mean_ms"]
            assert run["ttft_outside_engine_ms"] == pytest.approx(run["ttft_mean_ms"] - run["engine_ttft_mean_ms"], abs=0.02)
            # every request stored by its index, for pairing a request with itself on another target
            assert [r["index"] for r in run["requests"]] == list(range(int(phase[1])))
            assert all(0 < r["ttft_ms"] <= r["e2e_ms"] and r["tokens"] == 6 for r in run["requests"])
            ttfts = sorted(r["ttft_ms"] for r in run["requests"])  # 1 or 3 requests: the middle one is the p50
            assert ttfts[len(ttfts) // 2] == pytest.approx(run["ttft_p50_ms"], abs=0.01)
        assert result["figures"]["offline / b3 in24 out6"]["runs"][0]["peak_kv_usage"] > 0
    offline = result["figures"]["offline / b3 in24 out6"]["runs"][0]  # CPU time of this process, per token
    assert offline["engine_cpu_ms_per_token"] >= 0 and offline["serving_cpu_ms_per_token"] >= 0  # 10 ms ticks
    assert offline["engine_wait_ms_per_token"] >= 0
    assert "engine_cpu_ms_per_token" not in result["figures"]["v1 / b3 in24 out6"]["runs"][0]  # a server not started here
    # each engine warmed up on the whole workload before its timed runs (the server's through /v1,
    # the first target to reach it); /v2 and gRPC then only opened their connections and stream
    assert result["warmup_requests"] == {"offline": 4, "v1": 4, "v2": runner.PATH_WARMUP_REQUESTS,
                                         "grpc": runner.PATH_WARMUP_REQUESTS}
    assert result["turns"] == [["offline", "v1", "v2", "grpc"]]
    # the HTTP targets warmed their pools before each phase: no connection opened on the clock (/v2's
    # warm-up had opened 2, and its 3-request phase would open a third)
    for target in ("v1", "v2"):
        assert [result["figures"][f"{target} / {phase}"]["runs"][0]["connections_opened"]
                for phase in ("b1 in24 out6", "b3 in24 out6")] == [0, 0]
    assert "connections_opened" not in result["figures"]["grpc / b3 in24 out6"]["runs"][0]


def test_turn_order_rotates_between_repeats():
    assert runner.turns(["offline", "v1", "v2"], 4) == [["offline", "v1", "v2"], ["v1", "v2", "offline"],
                                                        ["v2", "offline", "v1"], ["offline", "v1", "v2"]]


def test_compare_cli_exits_1_only_on_a_regression(bench_results, tmp_path, capsys):
    base = results.load(bench_results[0])
    base["figures"] = {"gate": {"x": None, "runs": [{"throughput_ratio": 1.0 + i / 100} for i in range(6)]}}
    slow = json.loads(json.dumps(base))
    slow["figures"]["gate"]["runs"] = [{"throughput_ratio": 0.8 + i / 100} for i in range(6)]
    results.save(base, tmp_path / "base.json")
    results.save(slow, tmp_path / "slow.json")
    assert bench_main(["compare", str(tmp_path / "base.json"), str(tmp_path / "base.json")]) == 0
    assert bench_main(["compare", str(tmp_path / "base.json"), str(tmp_path / "slow.json")]) == 1
    assert "REGRESSION" in capsys.readouterr().out


def test_html_report_in_chromium(bench_results, tmp_path):
    from playwright.sync_api import sync_playwright

    out = tmp_path / "report.html"
    pngs = report.write([str(p) for p in bench_results], str(out))
    assert len(pngs) == 3 and all(p.read_bytes().startswith(b"\x89PNG") for p in pngs)  # 2 curves + history
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                             args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = browser.new_page()
            page.goto(out.as_uri())
            assert page.title() == "Codeyard benchmark report"
            widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete && i.naturalWidth)")
            assert len(widths) == 3 and all(w and w > 100 for w in widths)
            assert page.locator("tbody tr").count() == 16  # 4 targets x 2 phases x 2 results
            page.screenshot(path=str(ARTIFACTS / "bench-report.png"), full_page=True)
        finally:
            browser.close()
    assert (ARTIFACTS / "bench-report.png").stat().st_size > 10_000


def test_pinning_gives_the_offline_engine_its_own_cpu(tiny_chat_model, capsys):
    """--engine-cpus/--client-cpus: the offline engine's thread runs on its CPU with one torch thread,
    so an offline target and a server target's engine get the same CPU; a bad list is exit 2."""
    from benchmarks.framework.targets import Offline
    from benchmarks.framework.workloads import Item

    before = os.sched_getaffinity(0)
    target = Offline(str(tiny_chat_model), 2, cpus={0}, num_kv_blocks=16, max_model_len=128)
    try:
        assert asyncio.run(target.send(Item("def add(a, b):", 3))).ok
        thread = target.engine._thread
        assert thread is not None and thread.native_id is not None
        assert os.sched_getaffinity(thread.native_id) == {0}
        assert os.sched_getaffinity(0) == before  # only the engine's thread moved
        assert target.engine.engine is not None and target.engine.engine.config.num_threads == 1
        # the OS knows the engine's thread by name, so the CPU split finds it (and not the rest)
        assert Path(f"/proc/self/task/{thread.native_id}/comm").read_text().strip() == "llm-engine"
        assert Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip() != "llm-engine"
        engine, whole, wait = target.cpu()
        assert 0 < engine < whole and wait >= 0
    finally:
        asyncio.run(target.aclose())
    for engine, client in (("0", "0"), ("0", None), ("0-99", "1"), ("zero", "1")):
        argv = ["run", "grid", "--engine-cpus", engine] + (["--client-cpus", client] if client else [])
        assert bench_main(argv) == 2
        assert "cpus" in capsys.readouterr().err.lower()
    # --api-cpus places a started server's API process: beside the client unless told, "any" = unpinned
    from benchmarks.__main__ import UsageError, _api_cpus

    here = frozenset(os.sched_getaffinity(0))
    assert _api_cpus(None, frozenset({1})) == {1} and _api_cpus("any", frozenset({1})) == here
    assert _api_cpus("0", frozenset({1})) == {0}
    for text, client in (("any", None), ("0-99", frozenset({1}))):
        with pytest.raises(UsageError, match="--api-cpus"):
            _api_cpus(text, client)


def test_the_gate_takes_its_baseline_engine_out_of_git_or_says_why_not(tmp_path):
    """The gate's A/B imports the baseline commit's llm_engine from a scratch copy; a commit the clone lacks
    (a shallow clone) is a reason to fall back to the stored ratios, not an error."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=gate_ab.REPO, capture_output=True, text=True).stdout.strip()
    tree = gate_ab.extract_engine(head, tmp_path)
    assert (tree / "llm_engine" / "__init__.py").is_file() and not (tree / "benchmarks").exists()
    with pytest.raises(gate_ab.ABUnavailable, match="not in this clone"):
        gate_ab.extract_engine("0" * 40, tmp_path / "other")


@pytest.mark.parametrize("baseline", sorted(p.name for p in (gate_ab.REPO / "benchmarks" / "baselines").glob("gate*.json")))
def test_the_gate_worker_imports_over_each_stored_baselines_engine(tmp_path, baseline):
    """The A/B's baseline worker runs this tree's benchmark code over the stored commit's llm_engine:
    it must import there (a module-level import of a newer engine name made every A/B on gate.json's
    CPU kind fall back to the stored ratios, unseen, from 0bdbae1 to stop 34)."""
    commit = json.loads((gate_ab.REPO / "benchmarks" / "baselines" / baseline).read_text())["git"]["commit"]
    try:
        tree = gate_ab.extract_engine(commit, tmp_path)
    except gate_ab.ABUnavailable as exc:  # a shallow clone: the gate says so and uses the stored ratios
        pytest.skip(str(exc))
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; import llm_engine; "
            "from benchmarks.framework import gate, gate_ab, targets; print(llm_engine.__file__)")
    done = subprocess.run([sys.executable, "-c", code, str(tree), str(gate_ab.REPO)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip()).resolve() == (tree / "llm_engine" / "__init__.py").resolve()
