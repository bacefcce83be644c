"""Prompt lookup on the IDE assistant's own completions: the engine as the assistant makes it, with and without it.

    nice .venv/bin/python benchmarks/llm_spec_assistant.py --threads 1

Issue 18 asks that the assistant's completions use prompt lookup by default where it helps. This
asks ghost-text suggestions through the assistant's own call (`assistant.backends.LocalModel.complete`,
greedy, `completion_tokens` tokens, stopped by `prompts.line_is_complete` as the IDE stops them) of
two `LLMService`s on the built-in SmolLM2 made as `assistant/lazy_llm.py` makes them: one plain,
one with its `PROMPT_LOOKUP` ({"method": "ngram"}, k=5, n 4..1). Prompts come from
`prompts.completion_prompt` over standard-library files cut at the start of a line and in the
middle of one, after 600-2,400 characters, with another open file in front (what the editor
sends). Both services answer each prompt in turn (the order alternating), so other work on the
machine hits both alike; the ghost texts must be identical. Printed: median wall and process CPU
ms per suggestion, the CPU ratio plain / lookup (per prompt and in all) and the drafts' acceptance.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._llm_services import start_loaded  # noqa: E402

SOURCES = ("textwrap", "inspect", "json.decoder", "shutil", "difflib", "argparse", "pathlib", "statistics")
CUTS = (600, 1200, 1800, 2400)  # characters of the file before the cursor (snapped as below)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads per engine (default 1)")
    p.add_argument("--tokens", type=int, default=16, help="tokens per suggestion (default 16, the assistant's)")
    p.add_argument("--files", type=int, default=len(SOURCES), help=f"source files (1-{len(SOURCES)})")
    args = p.parse_args(argv)
    if args.threads < 1 or args.tokens < 1 or not 1 <= args.files <= len(SOURCES):
        p.error(f"--threads and --tokens must be at least 1, --files 1-{len(SOURCES)}")
    return args


def cursor_prompts(files: int) -> list[str]:
    """Completion prompts as the editor makes them: the file before the cursor, with the next file
    open beside it; the cursor at the start of a non-blank line (after its indentation) and mid-line."""
    import importlib

    from assistant import prompts

    texts = [Path(importlib.import_module(name).__file__ or "").read_text() for name in SOURCES[:files]]
    found = []
    for i, text in enumerate(texts):
        other = texts[(i + 1) % len(texts)]
        for cut in CUTS:
            line_start = text.index("\n", cut) + 1
            while not text[line_start:].split("\n", 1)[0].strip():  # a line with code on it
                line_start = text.index("\n", line_start) + 1
            indent = len(text[line_start:]) - len(text[line_start:].lstrip(" "))
            middle = line_start + indent + max(len(text[line_start:].split("\n", 1)[0].strip()) // 2, 1)
            for end in (line_start + indent, middle):
                found.append(prompts.completion_prompt("main.py", text[:end], [("other.py", other[:2000])]))
    return found


def start_services(threads: int) -> dict[str, Any]:
    """The assistant's engine (lazy_llm.py's EngineConfig), plain and with prompt lookup, loaded in turn."""
    from assistant.lazy_llm import PROMPT_LOOKUP
    from llm_engine import EngineConfig
    from llm_engine.entrypoints.models import builtin_model_path

    model = str(builtin_model_path())
    return start_loaded({row: EngineConfig(model=model, max_num_seqs=32, num_threads=threads, speculative_config=spec)
                         for row, spec in (("plain", None), ("lookup", PROMPT_LOOKUP))})


async def suggestions(services: dict[str, Any], texts: list[str], tokens: int) -> dict[str, list[tuple[float, float, str]]]:
    """(wall ms, process CPU ms, text) of each service's suggestion for every prompt."""
    from assistant import prompts
    from assistant.backends import LocalModel

    for service in services.values():  # warm-up
        await LocalModel(service).complete(texts[0][:500], tokens, prompts.line_is_complete)
    results: dict[str, list[tuple[float, float, str]]] = {row: [] for row in services}
    for i, prompt in enumerate(texts):
        for row in list(services)[::1 if i % 2 == 0 else -1]:
            wall, cpu = time.perf_counter(), time.process_time()
            text = await LocalModel(services[row]).complete(prompt, tokens, prompts.line_is_complete)
            results[row].append(((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000, text))
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    print(f"{args.tokens}-token suggestions, {args.threads} thread(s); load averages "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    texts = cursor_prompts(args.files)
    services = start_services(args.threads)
    try:
        results = asyncio.run(suggestions(services, texts, args.tokens))
        stats = services["lookup"].engine.require_engine().get_stats()
        length = services["lookup"].engine.require_engine().tokenize
        prompt_tokens = [len(length(text)[1]) for text in texts]
    finally:
        for service in services.values():
            service.stop()
    report: dict[str, Any] = {}
    for row, figures in results.items():
        report[row] = {"wall_ms": statistics.median(f[0] for f in figures),
                       "cpu_ms": statistics.median(f[1] for f in figures), "cpu_total_ms": sum(f[1] for f in figures)}
        print(f"{row:>7}: median {report[row]['wall_ms']:.0f} ms wall, {report[row]['cpu_ms']:.0f} ms CPU per "
              f"suggestion; {report[row]['cpu_total_ms']:.0f} CPU ms in all")
    ratios = [p[1] / s[1] for p, s in zip(results["plain"], results["lookup"])]
    from assistant.prompts import ghost_text

    # the same ghost text (a drafted step may bring tokens past the line's end before the IDE stops)
    identical = sum(ghost_text(p[2], "") == ghost_text(s[2], "") for p, s in zip(results["plain"], results["lookup"]))
    report |= {"cpu_ratio_median": statistics.median(ratios),
               "cpu_ratio_total": report["plain"]["cpu_total_ms"] / report["lookup"]["cpu_total_ms"],
               "identical": identical, "prompts": len(texts), "drafts": stats.spec_decode_num_drafts,
               "draft_tokens": stats.spec_decode_num_draft_tokens,
               "accepted_tokens": stats.spec_decode_num_accepted_tokens}
    print(f"{len(texts)} prompts of {min(prompt_tokens)}-{max(prompt_tokens)} tokens; plain / lookup CPU: median "
          f"{report['cpu_ratio_median']:.2f}x per suggestion, {report['cpu_ratio_total']:.2f}x in all (quartiles "
          f"{' '.join(f'{q:.2f}' for q in statistics.quantiles(ratios, n=4))}); identical {identical}/{len(texts)}; "
          f"drafts {stats.spec_decode_num_drafts}, accepted {stats.spec_decode_num_accepted_tokens}/"
          f"{stats.spec_decode_num_draft_tokens} drafted tokens; load averages "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return report


if __name__ == "__main__":
    run(parse_args(None))
