"""The measured dtype choice vs the build's default on this machine (issue 22's goal: >= 1.2x at a
perplexity within the budget): SmolLM2-135M (the bundled GGUF, dequantized, no quantization) built
twice with `codeyard llm build`'s code, once with the default dtype (float32) and once with
`--dtype auto` (each candidate dtype built, timed and scored on the calibration text; the fastest
within 1% perplexity kept), then both engines loaded with `LLM(ENGINE_DIR)` and timed in turns,
round after round, on a batch's greedy decode. Prints the build's trials, each engine's tokens/s
(median over rounds) and the median of the rounds' ratios.

    flock /tmp/codeyard-bench.lock python -m benchmarks.autodeploy_tune [--tokens 32] [--batch 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.autodeploy_speed import smollm_gguf, timed_generate
from llm_engine import LLM
from llm_engine.autodeploy.build import build_engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    prompts = [[1, 504, 3458, 314, 253, 1345 + i, 30] for i in range(args.batch)]
    rates: dict[str, list[float]] = {"default": [], "tuned": []}
    with tempfile.TemporaryDirectory(prefix="autodeploy-tune-") as scratch:
        engines = {}
        for name, dtype in (("default", "float32"), ("tuned", "auto")):
            start = time.perf_counter()
            report = build_engine(str(smollm_gguf()), Path(scratch) / name, dtype, None, progress=lambda _: None)
            print(f"{name:>7}: built in {time.perf_counter() - start:.0f} s", *report.choices, sep="\n    ", flush=True)
            engines[name] = LLM(str(Path(scratch) / name), kv_cache_memory="256MiB")
            timed_generate(engines[name], prompts[:1], 4)  # warm-up
        for _ in range(args.rounds):
            for name, llm in engines.items():
                rates[name].append(timed_generate(llm, prompts, args.tokens)[0])
            print(f"round: default {rates['default'][-1]:.1f} tuned {rates['tuned'][-1]:.1f} tok/s", flush=True)
    for name, values in rates.items():
        print(f"{name:>7}: batch of {args.batch} {statistics.median(values):6.1f} tok/s")
    ratio = statistics.median(t / d for t, d in zip(rates["tuned"], rates["default"]))
    print(f"tuned/default: {ratio:.2f}x (median of {args.rounds} rounds' ratios; goal >= 1.2x)")


if __name__ == "__main__":
    main()
