"""AutoDeploy end to end: architectures with no model file give Transformers' greedy tokens in
float32, alone and batched, with prefix-cache hits and forced preemption (a 12-block pool).

The default suite runs Gemma 2 (sliding window, soft-capping, tied embeddings, GELU);
`make test-autodeploy` (CODEYARD_AUTODEPLOY_FULL=1) runs every architecture in
autodeploy_models.ARCHITECTURES, Llama, Mistral, Qwen2 and Qwen3 through the pipeline against their
hand-written paths, and seven architectures at tensor_parallel_size=2.
"""

from __future__ import annotations

import os

import pytest
import torch
from autodeploy_models import ARCHITECTURES, build, hf_greedy, prompts

from llm_engine import LLM, SamplingParams
from llm_engine.autodeploy.model import AutoDeployedCausalLM

FULL = os.environ.get("CODEYARD_AUTODEPLOY_FULL") == "1"
MAX_NEW = 12
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES) if FULL else ["gemma2"])
def case(request, tmp_path_factory):
    folder = build(request.param, tmp_path_factory.mktemp(request.param))
    batch = prompts()
    return folder, batch, hf_greedy(folder, batch, MAX_NEW)


def tokens(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_greedy_parity_alone_batched_cached_and_preempted(case):
    folder, batch, ref = case
    llm = LLM(str(folder), dtype="float32", block_size=4, num_kv_blocks=12)
    model = llm.engine.model_runner.model
    assert isinstance(model, AutoDeployedCausalLM)
    assert not any(n.target is torch.ops.aten.layer_norm.default for n in model.body.graph.nodes)  # engine LayerNorms
    # the engine's rotary op, partial rotary included (StableLM, GPT-NeoX); Cohere's interleaved RoPE stays captured
    engine_rotary = not any(n.target is torch.ops.aten.cos.default for n in model.body.graph.nodes)
    assert engine_rotary == (not folder.name.startswith("cohere"))  # (mktemp numbers the folder)
    assert tokens(llm.generate(batch[0], GREEDY, use_tqdm=False)) == ref[:1]
    outputs = llm.generate(batch, GREEDY, use_tqdm=False)
    assert tokens(outputs) == ref
    assert sum(o.metrics.num_preemptions for o in outputs) > 0
    assert sum(o.metrics.num_cached_tokens for o in outputs) >= 12  # the first prompt's blocks, reused


@pytest.mark.skipif(not FULL, reason="make test-autodeploy")
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_registered_architecture_through_the_pipeline_matches_its_hand_written_path(tmp_path, model_type):
    folder = build(model_type, tmp_path / model_type)
    batch = prompts()
    native = LLM(str(folder), dtype="float32")
    auto = LLM(str(folder), dtype="float32", model_impl="auto")
    assert not isinstance(native.engine.model_runner.model, AutoDeployedCausalLM)
    assert isinstance(auto.engine.model_runner.model, AutoDeployedCausalLM)
    expected = tokens(native.generate(batch, GREEDY, use_tqdm=False))
    assert tokens(auto.generate(batch, GREEDY, use_tqdm=False)) == expected == hf_greedy(folder, batch, MAX_NEW)


@pytest.mark.skipif(not FULL, reason="make test-autodeploy")
@pytest.mark.parametrize("model_type", ["llama", "gemma2", "stablelm", "olmo2", "gpt_neox", "phi", "phi3"])
def test_tensor_parallel_2_gives_transformers_greedy_tokens_under_preemption(tmp_path, model_type):
    """shard_tensor_parallel in the engine's two gloo workers: merged q/k/v and gate/up column,
    o/down row, half the heads each (StableLM writes its head counts out), vocab-parallel embedding
    and LM head (Gemma 2's tied, windowed and soft-capped; Phi's with a bias); OLMo 2's q/k norms
    over all heads read the gathered projection; GPT-NeoX's per-head [q|k|v] rows split by heads;
    Phi-3's one q/k/v matrix and one gate/up matrix split per part."""
    folder = build(model_type, tmp_path / model_type)
    batch = prompts()
    llm = LLM(str(folder), dtype="float32", model_impl="auto", tensor_parallel_size=2, block_size=4,
              num_kv_blocks=12)
    try:
        outputs = llm.generate(batch, GREEDY, use_tqdm=False)
        assert tokens(outputs) == hf_greedy(folder, batch, MAX_NEW)
        assert sum(o.metrics.num_preemptions for o in outputs) > 0
    finally:
        llm.engine.shutdown()


def test_model_impl_is_validated():
    with pytest.raises(ValueError, match="model_impl"):
        LLM("/nonexistent", model_impl="handwritten")
