"""The measured dtype choice (`codeyard llm build --dtype auto`) and runtime options (`--tune`): the
rules on given trials, the dtype measurements on the hand-written tiny Llama (no capture, ~2 s),
and in `make test-autodeploy` builds end to end whose manifests record the trials and the choice
that LLM(ENGINE_DIR) then runs with."""

from __future__ import annotations

import json
import os

import pytest
import torch
from autodeploy_models import build, hand_written_llama, prompts, run_cli

from llm_engine.autodeploy.sensitivity import ScratchRunner, calibration_tokens
from llm_engine.autodeploy.tune import DtypeTrial, choose_dtype, decode_rate, measure_dtypes
from llm_engine.calibration import default_calibration_files
from llm_engine.engine_tune import RuntimeTrial, _pick
from llm_engine.layers.attention import Attention
from llm_engine.loader.engine_manifest import MANIFEST

FULL = os.environ.get("CODEYARD_AUTODEPLOY_FULL") == "1"


def test_the_fastest_dtype_within_the_budget_is_chosen():
    trials = [DtypeTrial("float32", 10.0, 5.00), DtypeTrial("bfloat16", 14.0, 5.04), DtypeTrial("float16", 20.0, 5.20)]
    assert choose_dtype(trials, 0.01).dtype == "bfloat16"  # float16 is faster but 4% worse
    assert choose_dtype(trials, 0.005).dtype == "float32"
    assert choose_dtype(trials, 0.05).dtype == "float16"


def test_a_runtime_option_changes_only_when_clearly_faster_within_the_budget():
    def trial(option, value, speed, perplexity=5.0):
        return RuntimeTrial({option: value}, speed, perplexity)

    current = trial("block_size", 16, 100.0)
    assert _pick("block_size", [trial("block_size", 32, 102.0)], current, 5.05) is current  # within the noise margin
    assert _pick("block_size", [trial("block_size", 32, 110.0)], current, 5.05).options == {"block_size": 32}
    assert _pick("block_size", [trial("block_size", 32, 110.0, 5.1)], current, 5.05) is current  # over the budget
    budgets = [trial("max_num_batched_tokens", n, speed) for n, speed in ((1024, 101.0), (512, 98.5), (256, 80.0))]
    default = trial("max_num_batched_tokens", 2048, 100.0)
    assert _pick("max_num_batched_tokens", budgets, default, 5.05).options == {"max_num_batched_tokens": 512}


def test_the_trial_decodes_the_model_and_scores_its_perplexity(tmp_path):
    model = hand_written_llama(tmp_path / "llama")
    windows = calibration_tokens(default_calibration_files(), None, model.config.vocab_size, 4, 32)
    (trial,) = measure_dtypes({"float32": model}, windows)
    assert trial.dtype == "float32" and trial.tokens_per_s > 0
    assert all(a.k_cache.numel() == 0 for a in model.modules() if isinstance(a, Attention))  # the pool released
    assert trial.perplexity == pytest.approx(ScratchRunner(model, 32).perplexity(windows))
    assert decode_rate(model, windows[:2], steps=2) > 0


@pytest.mark.skipif(not FULL, reason="make test-autodeploy")
def test_an_engine_built_with_dtype_auto_records_its_trials_and_runs(tmp_path):
    from llm_engine import LLM, SamplingParams
    from llm_engine.autodeploy.build import build_engine
    from llm_engine.autodeploy.tune import candidate_dtypes

    folder = build("llama", tmp_path / "llama")
    lines: list[str] = []
    report = build_engine(str(folder), tmp_path / "engine", "auto", None, progress=lines.append)
    manifest = json.loads((tmp_path / "engine" / MANIFEST).read_text())
    trials = [DtypeTrial(**trial) for trial in manifest["dtype_trials"]]
    assert [t.dtype for t in trials] == candidate_dtypes(torch.device("cpu"))
    assert manifest["dtype"] == choose_dtype(trials, 0.01).dtype
    assert [t.line() for t in trials] == [line.strip() for line in lines if line.strip().startswith("dtype ")]
    assert report.choices[-1] == f"dtype {manifest['dtype']} (the fastest within the budget)"
    llm = LLM(str(tmp_path / "engine"))
    outputs = llm.generate(prompts(), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 4 for o in outputs)


@pytest.mark.skipif(not FULL, reason="make test-autodeploy")
def test_an_engine_built_with_tune_records_its_runtime_trials_and_runs_with_the_choice(tmp_path, capsys):
    from llm_engine import LLM
    from llm_engine.autodeploy.build import build_engine
    from llm_engine.engine_tune import candidates

    folder = build("llama", tmp_path / "llama")
    threads = torch.get_num_threads()
    build_engine(str(folder), tmp_path / "engine", "float32", None, progress=lambda _: None)
    assert run_cli("tune", str(tmp_path / "engine")) == 0
    lines = capsys.readouterr().out.splitlines()
    runtime = json.loads((tmp_path / "engine" / MANIFEST).read_text())["runtime"]
    grid = candidates(torch.device("cpu"))
    trials = [RuntimeTrial(**trial) for trial in runtime["trials"]]
    assert trials[0].options == {name: values[0] for name, values in grid.items()}  # the engine's defaults first
    assert len(trials) == sum(len(values) for values in grid.values()) - len(grid) + 1 and not runtime["untried"]
    assert all(t.tokens_per_s > 0 and t.perplexity > 1 for t in trials)
    assert [t.line() for t in trials] == [line.strip().removesuffix(" (the engine's defaults)") for line in lines
                                          if line.strip().startswith("runtime ")][:len(trials)]
    assert lines[-1].startswith("runtime ") and lines[-1].endswith("(the fastest within the budget)")
    assert torch.get_num_threads() == threads  # the trials' thread counts do not outlive them
    assert run_cli("tune", str(folder)) == 2 and "is not a built engine" in capsys.readouterr().err
    config = LLM(str(tmp_path / "engine"), num_kv_blocks=16).engine.config
    torch.set_num_threads(threads)
    assert {name: getattr(config, name) for name in grid} == runtime["options"]
    assert run_cli("build", str(folder), "--out", str(tmp_path / "limited"), "--tune", "--tune-seconds", "0") == 0
    limited = json.loads((tmp_path / "limited" / MANIFEST).read_text())["runtime"]
    assert len(limited["trials"]) == 1
    assert limited["untried"] == [f"{name} {value}" for name, values in grid.items() for value in values[1:]]
