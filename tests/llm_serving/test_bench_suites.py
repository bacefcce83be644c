"""The framework's self-timed suites (the former standalone scripts) on tiny random models: each
runs through `python -m benchmarks run NAME` and leaves its figures in the result JSON, where
`compare` and `report` read them. The router suite starts five server processes: too slow for
`make test`, it runs with CODEYARD_BENCH_ROUTER=1."""

from __future__ import annotations

import os

import pytest

from benchmarks.__main__ import main as bench_main
from benchmarks.framework import report, results
from ide_server import cli


def run_suite(tmp_path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert bench_main(["run", name, *args, "--out", str(out)]) == 0
    result = results.load(out)
    assert result["kind"] == "suite" and result["name"] == name and result["git"]["commit"]
    assert result["directions"] and result["figures"]
    for key, entry in result["figures"].items():
        assert entry["runs"] and all(isinstance(v, float | int) for v in entry["runs"][0].values()), key
    assert bench_main(["compare", str(out), str(out)]) == 0  # the comparison reads the suite's own figures
    return result


def test_throughput_suite_engine_and_quantization_rows(tiny_chat_model, tmp_path):
    model = str(tiny_chat_model)
    result = run_suite(tmp_path, "throughput", "--model", model, "--systems", "engine", "--dtype", "float32",
                       "--num-prompts", "3", "--input-len", "8,24", "--output-len", "4,8", "--skip-prefix", "--kv-cache-memory", "32MiB", "--repeats", "2")
    [a, b] = result["figures"]["engine / float32"]["runs"]
    assert a["output_tok_per_s"] > 0 and b["output_tok_per_s"] > 0 and a["ttft_p50_ms"] > 0
    assert 0 <= result["figures"]["kv waste"]["runs"][0]["paged_waste"] < 1
    quant = run_suite(tmp_path, "throughput", "--model", model, "--systems", "engine", "--single-stream",
                      "--perplexity", "--rows", "int8", "--single-requests", "1", "--single-tokens", "6",
                      "--ppl-tokens", "200", "--ppl-window", "100")
    assert quant["figures"]["single-stream / int8"]["runs"][0]["tok_per_s"] > 0
    assert quant["figures"]["perplexity / int8"]["runs"][0]["perplexity"] > 1
    html = tmp_path / "report.html"
    report.write([str(tmp_path / "throughput.json")], str(html))
    assert "single-stream / int8" in html.read_text() and "tok_per_s" in html.read_text()  # the suite's own column
    with pytest.raises(SystemExit) as done:  # `codeyard bench` is the same command line
        cli.main(["bench", "compare", str(tmp_path / "throughput.json"), str(tmp_path / "throughput.json")])
    assert done.value.code == 0


@pytest.mark.parametrize("args", [["run", "nope"], ["run", "throughput", "--input-len", "9,3"],
                                  ["run", "poisson", "--set", "rates"], ["compare", "missing.json", "x.json"], []])
def test_codeyard_bench_bad_input_is_one_line_and_exit_2(args, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["bench", *args])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("codeyard bench: error: ") and err.count("\n") == 1, err


def test_spec_suite_outputs_match_and_count_drafts(tiny_chat_model, tmp_path):
    result = run_suite(tmp_path, "spec", "--model", str(tiny_chat_model), "--code-edits", "1", "--free-text", "1",
                       "--max-tokens", "12")
    assert set(result["figures"]) == {"code-edit", "free-text"}
    rows = result["report"]["workloads"]
    assert all(row["identical"] == row["requests"] == 1 for row in rows.values())  # speculation changes nothing
    assert result["figures"]["code-edit"]["runs"][0]["spec_tok_s"] > 0
    assert all(row["plain_cpu_ms_per_token"] > 0 and row["spec_cpu_ms_per_token"] > 0 for row in rows.values())
    assert result["figures"]["code-edit"]["runs"][0]["cpu_ratio"] > 0


def test_beam_suite_computes_one_token_per_beam_inside_the_engine(tiny_chat_model, tmp_path):
    result = run_suite(tmp_path, "beam", "--model", str(tiny_chat_model), "--requests", "1", "--widths", "2",
                       "--max-tokens", "6", "--dtype", "float32")
    row = result["report"]["widths"]["2"]
    assert row["same_beams"] == 1  # float32: both designs find the same beams
    assert row["inside_tokens"] < row["on_top_tokens"]  # no partial block recomputed each step
    assert result["figures"]["width 2"]["runs"][0]["ratio"] > 0


def test_spec_draft_suite_with_a_draft_model(tiny_chat_model, tmp_path):
    # the model as its own draft: every drafted token is accepted in float32 (in bfloat16 the draft's
    # catch-up forwards over several tokens, the prompt's first output token among them, round
    # otherwise than the target's one-token rows)
    model = str(tiny_chat_model)
    result = run_suite(tmp_path, "spec-draft", "--model", model, "--draft-model", model, "--code-edits", "1",
                       "--free-text", "1", "--max-tokens", "8", "--k", "2", "--dtype", "float32")
    draft = tiny_chat_model.name
    assert set(result["figures"]) == {f"{draft} / code-edit", f"{draft} / free-text"}
    rows = result["report"][draft]
    assert all(row["identical"] == row["requests"] == 1 for row in rows.values())
    assert rows["code-edit"]["accepted_tokens"] == rows["code-edit"]["draft_tokens"] > 0


@pytest.mark.parametrize("name", ["batched-vs-llamacpp", "1b-int4", "single-stream", "spec-draft", "disagg"])
def test_script_suites_take_the_framework_options(name, capsys):
    """The scripts kept at their paths are suites too: `--help` lists their options beside
    --repeats and --out, and a bad value is one line and exit 2 before anything is built."""
    with pytest.raises(SystemExit) as done:
        bench_main(["run", name, "--help"])
    assert done.value.code == 0
    assert "--repeats" in capsys.readouterr().out
    assert bench_main(["run", name, "--repeats", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_structured_suite_times_masks(tiny_chat_model, tmp_path):
    result = run_suite(tmp_path, "structured", "--model", str(tiny_chat_model), "--prompts", "1",
                       "--max-tokens", "12")
    [run] = result["figures"]["single-stream"]["runs"]
    assert run["constrained_ms_per_token"] > 0 and run["mask_ms_per_token"] > 0


def test_vision_suite_ttft_kinds(tmp_path):
    result = run_suite(tmp_path, "vision-ttft", "--rounds", "1", "--vision-layers", "1", "--vision-hidden", "64")
    assert set(result["figures"]) == {"new", "repeat", "repeat-moved"}
    assert result["figures"]["new"]["runs"][0]["ttft_vs_new"] == pytest.approx(1.0)
    assert result["report"]["encoder_cache"]["hits"] >= 1  # the repeated picture's features came from the cache


@pytest.mark.skipif(not os.environ.get("CODEYARD_BENCH_ROUTER"), reason="starts five servers (~1 min): "
                    "CODEYARD_BENCH_ROUTER=1")
def test_router_suite_hit_rates(tiny_chat_model, tmp_path):
    result = run_suite(tmp_path, "router", "--model", str(tiny_chat_model), "--preambles", "2", "--rounds", "2")
    rates = {setup: entry["runs"][0]["hit_rate"] for setup, entry in result["figures"].items()}
    assert set(rates) == {"1 replica", "2 replicas, cache-aware", "2 replicas, round-robin"}
    # the second round repeats every preamble: one replica and the cache-aware pair reuse them
    assert rates["1 replica"] > 0.3 and rates["2 replicas, cache-aware"] >= rates["2 replicas, round-robin"]
