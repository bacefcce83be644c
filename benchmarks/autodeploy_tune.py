"""The measured configuration vs the build's defaults on this machine (issue 22's goal: >= 1.2x at
a perplexity within the budget): SmolLM2-135M (the bundled GGUF, dequantized, no quantization)
built twice with `codeyard llm build`'s code, once with the defaults (float32) and once with
`--dtype auto --tune` (each candidate dtype built, timed and scored on the calibration text; then
the attention backend, threads, KV block size and token budget timed through the written engine;
the fastest within 1% perplexity kept). Three engines are then timed in turns, round after round,
on a batch's greedy decode: the default build, the tuned build run with the engine's default
runtime options (the dtype's share), and the tuned build as `LLM(ENGINE_DIR)` loads it. Prints
the build's trials, each one's tokens/s (median over rounds) and the medians of the rounds' ratios.

    flock /tmp/codeyard-bench.lock python -m benchmarks.autodeploy_tune [--tokens 32] [--batch 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.autodeploy_speed import smollm_gguf, timed_generate
from llm_engine import LLM
from llm_engine.autodeploy.build import build_engine
from llm_engine.engine_tune import engine_defaults, tune_engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    threads = torch.get_num_threads()  # the engine's default
    prompts = [[1, 504, 3458, 314, 253, 1345 + i, 30] for i in range(args.batch)]
    with tempfile.TemporaryDirectory(prefix="autodeploy-tune-") as scratch:
        folders = {"default": Path(scratch) / "default", "tuned": Path(scratch) / "tuned"}
        for name, folder in folders.items():
            start = time.perf_counter()
            report = build_engine(str(smollm_gguf()), folder, "float32" if name == "default" else "auto", None,
                                  progress=lambda _: None)
            print(f"{name:>7}: built in {time.perf_counter() - start:.0f} s", *report.choices, sep="\n    ", flush=True)
            if name == "tuned":  # each trial's line as it ends
                choice = tune_engine(folder, progress=lambda line: print(f"    {line.strip()}", flush=True))
                print(f"    built and tuned in {time.perf_counter() - start:.0f} s", *choice.lines()[len(choice.trials):],
                      sep="\n    ", flush=True)
        engines = {"default": LLM(str(folders["default"]), kv_cache_memory="256MiB"),
                   "dtype only": LLM(str(folders["tuned"]), kv_cache_memory="256MiB", **engine_defaults()),
                   "tuned": LLM(str(folders["tuned"]), kv_cache_memory="256MiB")}

        def rate(llm: LLM, batch: list[list[int]], tokens: int) -> float:
            torch.set_num_threads(llm.engine.config.num_threads or threads)  # process-wide: each engine's own
            return timed_generate(llm, batch, tokens)[0]

        for llm in engines.values():
            rate(llm, prompts[:1], 4)  # warm-up
        rates: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.rounds):
            for name, llm in engines.items():
                rates[name].append(rate(llm, prompts, args.tokens))
            print("round: " + ", ".join(f"{name} {values[-1]:.1f}" for name, values in rates.items()) + " tok/s",
                  flush=True)
    for name, values in rates.items():
        print(f"{name:>10}: batch of {args.batch} {statistics.median(values):6.1f} tok/s")
    for name in ("dtype only", "tuned"):
        ratio = statistics.median(t / d for t, d in zip(rates[name], rates["default"]))
        print(f"{name}/default: {ratio:.2f}x (median of {args.rounds} rounds' ratios)")
    ratio = statistics.median(t / d for t, d in zip(rates["tuned"], rates["dtype only"]))
    print(f"tuned/dtype only: {ratio:.2f}x (the runtime options' share); goal tuned/default >= 1.2x")


if __name__ == "__main__":
    main()
