"""The LLM throughput benchmark's workload builder and metric math, on tiny inputs (no model)."""

import pytest

from benchmarks._workload import (
    KvWasteMeter,
    RequestTiming,
    percentile,
    random_workload,
    shared_prefix_workload,
    summarize,
)
from benchmarks.suites.quant_calibrated import verdicts
from benchmarks.suites.throughput import parse_args, throughput_ratios


def test_random_workload_is_seeded_and_within_bounds():
    a = random_workload(64, 100, 49152, seed=7)
    b = random_workload(64, 100, 49152, seed=7)
    c = random_workload(64, 100, 49152, seed=8)
    assert a == b
    assert a != c
    assert len(a) == 64
    assert all(16 <= len(r.prompt_token_ids) <= 512 for r in a)
    assert all(16 <= r.max_tokens <= 256 for r in a)
    assert all(100 <= t < 49152 for r in a for t in r.prompt_token_ids)
    # 64 uniform draws over 16..512 should spread out, not collapse to one length
    assert len({len(r.prompt_token_ids) for r in a}) > 32


def test_shared_prefix_workload_shares_exactly_the_preamble():
    reqs = shared_prefix_workload(8, 100, 200, prefix_len=512, suffix_len=(16, 64), output_len=16, seed=3)
    preamble = reqs[0].prompt_token_ids[:512]
    assert all(r.prompt_token_ids[:512] == preamble for r in reqs)
    assert all(528 <= len(r.prompt_token_ids) <= 576 and r.max_tokens == 16 for r in reqs)
    assert len({tuple(r.prompt_token_ids[512:]) for r in reqs}) == 8


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_requests": 0}, "num_requests"),
        ({"input_len": (0, 4)}, "input_len"),
        ({"output_len": (9, 4)}, "output_len"),
        ({"vocab_low": 50, "vocab_high": 50}, "vocab_low"),
    ],
)
def test_random_workload_rejects_bad_sizes(kwargs, field):
    args = {"num_requests": 4, "vocab_low": 100, "vocab_high": 200} | kwargs
    with pytest.raises(ValueError, match=field):
        random_workload(**args)


def test_percentile_interpolates_like_numpy():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 25) == 2.0
    assert percentile(list(map(float, range(1, 101))), 99) == pytest.approx(99.01)
    assert percentile([1.0, 2.0], 50) == 1.5
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summarize_throughput_ttft_and_tpot():
    timings = [
        RequestTiming(start=0.0, first_token=0.5, finished=1.5, num_tokens=11),  # tpot 0.1
        RequestTiming(start=0.0, first_token=1.0, finished=4.0, num_tokens=11),  # tpot 0.3
        RequestTiming(start=2.0, first_token=2.5, finished=2.5, num_tokens=1),  # no tpot
    ]
    s = summarize("x", timings, elapsed_s=4.0)
    assert s.output_tokens == 23
    assert s.output_tok_per_s == pytest.approx(5.75)
    assert s.req_per_s == pytest.approx(0.75)
    assert s.ttft_mean_s == pytest.approx((0.5 + 1.0 + 0.5) / 3)
    assert s.ttft_p50_s == pytest.approx(0.5)
    assert s.tpot_p50_s == pytest.approx(0.2)
    assert s.tpot_p99_s == pytest.approx(0.1 + 0.2 * 0.99)


def test_kv_waste_paged_vs_contiguous():
    meter = KvWasteMeter(max_len=64)
    # two sequences of 17 and 32 tokens in blocks of 16: 3 + 2 blocks = 80 slots, 49 held
    meter.record(allocated_slots=80, held_slots=49, seq_lengths=[17, 32])
    # two sequences sharing one full 16-token block, each with 4 more tokens in a block of its own
    meter.record(allocated_slots=48, held_slots=24, seq_lengths=[20, 20])
    meter.record(allocated_slots=0, held_slots=0, seq_lengths=[])  # an idle step is not a snapshot
    assert meter.snapshots == 2
    assert meter.paged_waste == pytest.approx(1 - 73 / 128)
    assert meter.peak_paged_waste == pytest.approx(0.5)
    assert meter.contiguous_waste == pytest.approx(1 - 89 / (64 * 4))
    with pytest.raises(ValueError):
        meter.record(allocated_slots=16, held_slots=17, seq_lengths=[17])
    with pytest.raises(ValueError):
        meter.record(allocated_slots=80, held_slots=65, seq_lengths=[65])


def test_ratios_against_each_baseline_and_goals():
    def run(name, tokens_in_one_second):
        return summarize(name, [RequestTiming(0.0, 0.5, 1.0, tokens_in_one_second)], elapsed_s=1.0)

    summaries = {"engine": run("engine", 300), "hf-single": run("hf-single", 20),
                 "hf-batch": run("hf-batch", 200), "llamacpp": run("llamacpp", 100)}
    ratios = throughput_ratios(summaries)
    assert ratios["hf-single"] == {"ratio": pytest.approx(15.0), "goal": 10.0, "met": True}
    assert ratios["hf-batch"]["ratio"] == pytest.approx(1.5) and not ratios["hf-batch"]["met"]
    assert ratios["llamacpp"]["met"] is True
    assert throughput_ratios({"hf-batch": summaries["hf-batch"]}) == {}


def test_cli_rejects_unknown_systems_and_quick_mode_shrinks_the_run(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--systems", "engine,vllm"])
    assert exc.value.code == 2
    assert "vllm" in capsys.readouterr().err
    args = parse_args(["--quick", "--systems", "engine"])
    assert (args.num_prompts, args.prefix_requests, args.systems) == (16, 16, ["engine"])


def test_cli_runs_both_dtypes_by_default_and_rejects_unknown_ones(capsys):
    assert parse_args([]).dtypes == ["float32", "bfloat16"]
    assert parse_args(["--dtype", "bfloat16"]).dtypes == ["bfloat16"]
    with pytest.raises(SystemExit) as exc:
        parse_args(["--dtype", "float32,int8"])
    assert exc.value.code == 2
    assert "--dtype: unknown ['int8']" in capsys.readouterr().err


def test_calibrated_rows_are_judged_against_the_better_rtn_row_of_their_group(capsys):
    rows = {"int4 g64 sym": 15.0, "int4 g64 asym": 14.0, "gptq g64": 13.0, "awq g64": 11.5, "awq g128": 12.0}
    judged = verdicts(rows, base=10.0)
    assert judged["gptq g64"] == (pytest.approx(0.75), False)  # 3 of asym's 4 points of excess
    assert judged["awq g64"] == (pytest.approx(0.375), True)
    assert "awq g128" not in judged  # no RTN g128 row to set it against
    assert parse_args(["--perplexity", "--rows", "awq g128,int4 g128 sym"]).rows == ["awq g128", "int4 g128 sym"]
    with pytest.raises(SystemExit):
        parse_args(["--rows", "awq g32"])
    assert "awq g32" in capsys.readouterr().err
