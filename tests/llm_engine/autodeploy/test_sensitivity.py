"""The sensitivity pass keeps a deliberately fragile layer in float and quantizes the rest within
the budget. The default suite scores the hand-written tiny Llama (the pass takes any engine model:
no capture, ~2 s); `make test-autodeploy` builds an engine with `--accuracy-budget` end to end."""

from __future__ import annotations

import json
import os

import pytest
import torch
from autodeploy_models import build, hand_written_llama

from llm_engine.autodeploy.sensitivity import calibration_tokens, measure_sensitivity
from llm_engine.calibration import default_calibration_files
from llm_engine.layers.attention import TorchPagedAttention
from llm_engine.loader import ModelSource
from llm_engine.loader.engine_manifest import MANIFEST
from llm_engine.models.llama import LlamaForCausalLM

FULL = os.environ.get("CODEYARD_AUTODEPLOY_FULL") == "1"
FRAGILE = "model.layers.1.mlp.down_proj"


def make_fragile(weights: dict[str, torch.Tensor]) -> None:
    """Layer 1's down projection gets one huge weight per row on an input that is always 0 (its up
    projection row is zeroed): the float model computes the same, but int8's per-row scale, set by
    the outlier, rounds every other weight of that layer to a step or two."""
    up, down = weights["model.layers.1.mlp.up_proj.weight"], weights["model.layers.1.mlp.down_proj.weight"]
    up[0] = 0
    down[:, 0] = 100 * down.abs().max()


def batch(vocab: int) -> list[list[int]]:
    return calibration_tokens(default_calibration_files(), None, vocab, 3, 64)


def test_a_fragile_layer_is_kept_in_float_and_the_rest_quantized(tmp_path):
    folder = build("llama", tmp_path / "llama")
    source = ModelSource(str(folder))
    config = source.hf_config()
    weights = dict(source.weights(config))
    make_fragile(weights)
    model = LlamaForCausalLM(config, TorchPagedAttention(), torch.float32)
    model.load_weights(weights.items())
    result = measure_sensitivity(model, "int8", batch(config.vocab_size), budget=0.01)
    assert max(result.errors, key=result.errors.__getitem__) == FRAGILE
    assert result.errors[FRAGILE] > 10 * sorted(result.errors.values())[-2]
    assert result.kept == [FRAGILE]
    ppl = result.perplexity
    assert ppl["all quantized"] > ppl["float"] * 1.01 >= ppl["chosen"]
    assert result.quantization() == {"method": "int8", "ignore": [FRAGILE]}
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters())  # left float


def test_a_loose_budget_keeps_nothing(tmp_path):
    model = hand_written_llama(tmp_path / "llama")
    assert measure_sensitivity(model, "int8", batch(model.config.vocab_size), budget=1.0).kept == []


@pytest.mark.skipif(not FULL, reason="make test-autodeploy")
def test_an_engine_built_with_a_budget_records_and_runs_the_choice(tmp_path):
    from safetensors.torch import load_file, save_file

    from llm_engine import LLM, SamplingParams
    from llm_engine.autodeploy.build import build_engine

    folder = build("llama", tmp_path / "llama")
    weights = load_file(folder / "model.safetensors")
    make_fragile(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    report = build_engine(str(folder), tmp_path / "engine", "float32", "int8", 0.01, progress=lambda _: None)
    fragile = f"body.{FRAGILE}"
    assert any("kept in float: 1 of" in line and fragile in line for line in report.choices)
    manifest = json.loads((tmp_path / "engine" / MANIFEST).read_text())
    assert manifest["sensitivity"]["kept"] == [fragile]
    assert manifest["quantization"][fragile] == "float"
    assert sum(kind != "float" for kind in manifest["quantization"].values()) == len(manifest["quantization"]) - 1
    llm = LLM(str(tmp_path / "engine"))
    assert llm.engine.model_runner.quantization[fragile] == "float"
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
