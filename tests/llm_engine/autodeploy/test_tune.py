"""The measured dtype choice (`codeyard llm build --dtype auto`): the rule on given trials, the
measurements on the hand-written tiny Llama (no capture, ~2 s), and in `make test-autodeploy` a
build end to end whose manifest records the trials and the dtype they chose."""

from __future__ import annotations

import json
import os

import pytest
import torch
from autodeploy_models import build, hand_written_llama, prompts

from llm_engine.autodeploy.sensitivity import ScratchRunner, calibration_tokens
from llm_engine.autodeploy.tune import DtypeTrial, choose_dtype, decode_rate, measure_dtype
from llm_engine.calibration import default_calibration_files
from llm_engine.layers.attention import Attention
from llm_engine.loader.engine_manifest import MANIFEST

FULL = os.environ.get("CODEYARD_AUTODEPLOY_FULL") == "1"


def test_the_fastest_dtype_within_the_budget_is_chosen():
    trials = [DtypeTrial("float32", 10.0, 5.00), DtypeTrial("bfloat16", 14.0, 5.04), DtypeTrial("float16", 20.0, 5.20)]
    assert choose_dtype(trials, 0.01).dtype == "bfloat16"  # float16 is faster but 4% worse
    assert choose_dtype(trials, 0.005).dtype == "float32"
    assert choose_dtype(trials, 0.05).dtype == "float16"


def test_the_trial_decodes_the_model_and_scores_its_perplexity(tmp_path):
    model = hand_written_llama(tmp_path / "llama")
    windows = calibration_tokens(default_calibration_files(), None, model.config.vocab_size, 4, 32)
    trial = measure_dtype(model, "float32", windows)
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
