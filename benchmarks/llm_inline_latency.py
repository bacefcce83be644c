"""Inline completion latency on the IDE's path: the built-in model kept quantized (the default) against its bf16 copy.

    flock /tmp/codeyard-bench.lock .venv/bin/python benchmarks/llm_inline_latency.py --threads 1

What a student waits for: a 16-token ghost-text suggestion (the assistant's `completion_tokens`
default), asked through the assistant's own call (`assistant.backends.LocalModel.complete`) of an
`LLMService` on the built-in SmolLM2-135M Q4_1 made as the IDE makes it (`assistant/lazy_llm.py`'s
EngineConfig). Prompts are built by `assistant.prompts.completion_prompt` from standard-library
source files cut after 1,200 and 1,600 characters (~270-570 tokens; a file's start differs from
the others', so no round reuses another's cached prefix: the cold case). Rows:
  quantized  the GGUF's Q4_1 blocks kept as they are, default dtype (the IDE's default)
  bf16       the same weights dequantized to bfloat16 (the unquantized engine: "before")
Both engines are loaded once and asked in turn (the order alternating per prompt), so machine
noise hits both alike. Suggestions are never cut short (the IDE stops at the end of a line).
Printed: median wall and process CPU milliseconds per suggestion and each round's CPU ratio.
The machine is shared: read the CPU column and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import inspect
import json
import os
import pathlib
import shutil
import statistics
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._llm_services import start_loaded  # noqa: E402

SOURCES = (textwrap, inspect, json, shutil, difflib, argparse, pathlib, statistics)  # stdlib text: local, offline
CUTS = (1200, 1600)  # characters of each file before the cursor
ROWS = {"quantized": ("auto", "auto"), "bf16": ("bfloat16", None)}  # dtype, quantization


def parse_args(argv: list[str] | None, p: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    p = p or argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads per engine (default 1)")
    p.add_argument("--tokens", type=int, default=16, help="tokens per suggestion (default 16, the assistant's)")
    args = p.parse_args(argv)
    if args.threads < 1 or args.tokens < 1:
        p.error("--threads and --tokens must be at least 1")
    return args


def start_services(threads: int) -> dict:
    """One LLMService per row, loaded one after the other."""
    from llm_engine import EngineConfig
    from llm_engine.entrypoints.models import builtin_model_path

    model = str(builtin_model_path())
    return start_loaded({row: EngineConfig(model=model, max_num_seqs=32, dtype=dtype, quantization=quantization,
                                           num_threads=threads) for row, (dtype, quantization) in ROWS.items()})


async def suggestions(services: dict, tokens: int) -> dict[str, list[tuple[float, float, int]]]:
    """(wall ms, process CPU ms, prompt tokens) of each row's suggestion for every prompt."""
    from assistant import prompts
    from assistant.backends import LocalModel

    texts = [Path(module.__file__).read_text() for module in SOURCES]
    for service in services.values():  # warm-up
        await LocalModel(service).complete(prompts.completion_prompt("main.py", texts[0][:1000], []), tokens,
                                           lambda _: False)
    results: dict[str, list[tuple[float, float, int]]] = {row: [] for row in services}
    for i, (cut, text) in enumerate((cut, text) for cut in CUTS for text in texts):
        prompt = prompts.completion_prompt("main.py", text[:cut], [])
        for row in list(services)[::1 if i % 2 == 0 else -1]:
            service = services[row]
            length = len(service.engine.require_engine().tokenize(prompt)[1])
            wall, cpu = time.perf_counter(), time.process_time()
            await LocalModel(service).complete(prompt, tokens, lambda _: False)
            results[row].append(((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000, length))
    return results


def run(args: argparse.Namespace) -> dict:
    print(f"{args.tokens}-token suggestions, {args.threads} thread(s); load averages "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} (shared machine: noisy)", flush=True)
    services = start_services(args.threads)
    try:
        results = asyncio.run(suggestions(services, args.tokens))
    finally:
        for service in services.values():
            service.stop()
    report: dict = {}
    for row, figures in results.items():
        report[row] = {"wall_ms": statistics.median(f[0] for f in figures),
                       "cpu_ms": statistics.median(f[1] for f in figures)}
        lengths = [f[2] for f in figures]
        print(f"{row:>10}: median {report[row]['wall_ms']:.0f} ms wall, {report[row]['cpu_ms']:.0f} ms CPU per "
              f"suggestion ({len(figures)} prompts of {min(lengths)}-{max(lengths)} tokens)")
    ratios = [b[1] / q[1] for q, b in zip(results["quantized"], results["bf16"])]
    report["cpu_ratio"] = statistics.median(ratios)
    print(f"bf16 / quantized CPU per suggestion: median {report['cpu_ratio']:.2f}x (rounds "
          f"{' '.join(f'{r:.2f}' for r in ratios)}); load averages {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return report


if __name__ == "__main__":
    run(parse_args(None))
