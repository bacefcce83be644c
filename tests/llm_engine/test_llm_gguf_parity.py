"""The real SmolLM2-135M-Instruct GGUF (Q4_1): our loader and engine vs transformers loading it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from llm_engine import LLM, SamplingParams

from conftest import hf_greedy, smollm_gguf_path

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
]
MAX_NEW = 32


@pytest.mark.timeout(1800)  # two 135M-parameter loads; ~2 min on an idle 2-core machine
def test_smollm2_gguf_greedy_matches_transformers():
    path = smollm_gguf_path()
    llm = LLM(model=str(path), dtype="float32", kv_cache_memory="64MiB", max_num_batched_tokens=64)
    tokenizer = llm.get_tokenizer()
    prompt_ids = [tokenizer(p).input_ids for p in PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
    ours = llm.generate(PROMPTS, params, use_tqdm=False)

    hf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    ref = hf_greedy(hf_model, prompt_ids, MAX_NEW)
    for out, ids, (ref_tokens, ref_logprobs) in zip(ours, prompt_ids, ref):
        completion = out.outputs[0]
        assert out.prompt_token_ids == ids
        assert completion.token_ids == ref_tokens, (out.prompt, completion.text, tokenizer.decode(ref_tokens))
        for step, token in enumerate(ref_tokens):
            assert abs(completion.logprobs[step][token].logprob - ref_logprobs[step]) < 2e-3
        assert completion.text == tokenizer.decode(ref_tokens, skip_special_tokens=True)
