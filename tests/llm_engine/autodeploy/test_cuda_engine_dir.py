"""`llm build --target cuda` on a GPU: the engine is built there (its attention checked against the
Triton backend), loads with device="cuda" and gives Transformers' greedy tokens on the same GPU in
float32, alone and batched, with prefix-cache hits. Skipped without a CUDA device; it has not run
yet (no GPU was lent to issue 22's sessions). On a GPU machine without the IDE's packages:

    python3 -m pytest -p no:cacheprovider -q -o addopts="" --confcutdir=tests/llm_engine \\
        tests/llm_engine/autodeploy/test_cuda_engine_dir.py
"""

from __future__ import annotations

import pytest
import torch
from autodeploy_models import build, prompts
from transformers import AutoModelForCausalLM

from llm_engine import LLM, SamplingParams
from llm_engine.autodeploy.build import build_engine
from llm_engine.loader.engine_manifest import EngineManifest

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

MAX_NEW = 10
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)


def hf_greedy_on_cuda(folder, batch: list[list[int]]) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda().eval()
    out = []
    for prompt in batch:
        with torch.no_grad():
            ids = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=MAX_NEW, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        out.append(ids[0, len(prompt):].tolist())
    return out


@pytest.mark.parametrize("model_type", ["llama", "olmo2", "phi3"])  # no windowed/soft-capped attention: CPU only
@pytest.mark.parametrize("enforce_eager", [True, False])
def test_a_cuda_engine_gives_transformers_greedy_tokens_on_the_gpu(tmp_path, model_type, enforce_eager):
    checkpoint = build(model_type, tmp_path / model_type)
    build_engine(str(checkpoint), tmp_path / "engine", target="cuda", progress=lambda _: None)
    assert EngineManifest.read(tmp_path / "engine").target == "cuda"
    batch = prompts()
    llm = LLM(str(tmp_path / "engine"), device="cuda", enforce_eager=enforce_eager, block_size=4, num_kv_blocks=64)
    outputs = llm.generate(batch, GREEDY, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == hf_greedy_on_cuda(checkpoint, batch)
    assert sum(o.metrics.num_cached_tokens for o in outputs) >= 12
