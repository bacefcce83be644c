"""Per-token cost of structured outputs (xgrammar token masks) on SmolLM2-135M-Instruct.

Each request asks the model for a JSON answer under a schema (a list of fixes for a code
snippet). The constrained run goes first; the same prompt then runs unconstrained for exactly as
many tokens (ignore_eos), so both runs decode the same number of tokens. Done one request at a
time (single stream) and as one batch. Prints ms per output token for both, the overhead per
token and the ratio, and how many constrained outputs parse and validate (they all must). On a
busy machine those end-to-end timings are noisy, so the mask work itself is also timed: the
constrained outputs are replayed through a fresh matcher, timing per token what the sampler adds
(fill the bitmask, mask a logits row).

    python -m benchmarks run structured              # 8 prompts
    python -m benchmarks run structured --prompts 4 --out out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jsonschema_rs
import torch

from benchmarks.suites.throughput import find_smollm2_gguf

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["fixes"], "properties": {
    "fixes": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "object", "additionalProperties": False, "required": ["line", "kind", "message"],
        "properties": {"line": {"type": "integer", "minimum": 1, "maximum": 200},
                       "kind": {"enum": ["bug", "style", "performance", "naming"]},
                       "message": {"type": "string", "maxLength": 80}}}}}}
SNIPPETS = ["def add(a, b):\n    return a - b", "for i in range(len(xs)):\n    print(xs[i])",
            "def f(l):\n    l.sort()\n    return l[0]", "x = open('data.txt').read()",
            "if flag == True:\n    run()", "def avg(v):\n    return sum(v) / len(v)",
            "import os, sys, json", "while True:\n    data = poll()\n    if data: break"]


def prompts(tokenizer, count: int) -> list[str]:
    question = ("List the fixes this Python code needs as JSON: {{\"fixes\": [{{\"line\", \"kind\", "
                "\"message\"}}]}}.\n\n{}")
    return [tokenizer.apply_chat_template([{"role": "user", "content": question.format(SNIPPETS[i % len(SNIPPETS)])}],
                                          tokenize=False, add_generation_prompt=True) for i in range(count)]


def timed(llm, batch: list[str], params: list) -> tuple[list, float]:
    start = time.perf_counter()
    outputs = llm.generate(batch, params, use_tqdm=False)
    return outputs, time.perf_counter() - start


def compare(llm, batch: list[str], max_tokens: int) -> dict:
    """Constrained then unconstrained for as many tokens, over `batch` run together."""
    from llm_engine import SamplingParams
    from llm_engine.structured_outputs import StructuredOutputsParams

    constrained = SamplingParams(temperature=0, max_tokens=max_tokens,
                                 structured_outputs=StructuredOutputsParams(json=SCHEMA))
    outs, t_constrained = timed(llm, batch, [constrained] * len(batch))
    mask_ms = replay_mask_ms(llm, outs)
    counts = [len(o.outputs[0].token_ids) for o in outs]
    free = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in counts]
    _, t_free = timed(llm, batch, free)
    valid = 0
    for out in outs:
        try:
            valid += jsonschema_rs.is_valid(SCHEMA, json.loads(out.outputs[0].text))
        except ValueError:
            pass
    tokens = sum(counts)
    return {"tokens": tokens, "mask_ms": mask_ms, "free_s": t_free, "constrained_s": t_constrained, "valid": valid, "requests": len(batch)}


def replay_mask_ms(llm, outputs: list) -> float:
    """Milliseconds per token of the sampler's grammar work, replaying the constrained outputs."""
    import torch

    from llm_engine.structured_outputs import GrammarCompiler, StructuredOutputsParams, apply_grammar_masks

    engine = llm.engine
    compiler = GrammarCompiler(engine.tokenizer, engine.vocab_size, engine.eos_token_ids)
    grammar = compiler.compile(StructuredOutputsParams(json=SCHEMA))
    logits = torch.randn(1, engine.vocab_size)
    tokens, start = 0, time.perf_counter()
    for out in outputs:
        state = grammar.new_state()
        for token in out.outputs[0].token_ids:
            apply_grammar_masks(logits, [0], [state])
            state.accept(token)
            tokens += 1
    return 1000 * (time.perf_counter() - start) / tokens


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser) -> argparse.Namespace:
    parser.add_argument("--model", type=Path, help="local HF folder or .gguf (default: the built-in SmolLM2)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    from llm_engine import LLM

    gguf = args.model or find_smollm2_gguf()
    llm = LLM(model=str(gguf), kv_cache_memory="256MiB", num_threads=args.threads, enable_prefix_caching=False)
    batch = prompts(llm.get_tokenizer(), args.prompts)
    compare(llm, batch[:1], 8)  # warm-up (and xgrammar's import), outside the timings
    print(f"model {gguf.name}, {args.threads} threads, {args.prompts} prompts, greedy")
    print(f"{'mode':<14}{'tokens':>8}{'free ms/tok':>13}{'json ms/tok':>13}{'overhead ms/tok':>17}{'ratio':>8}"
          f"{'valid':>8}{'mask ms/tok':>13}")
    report: dict = {"model": gguf.name, "threads": args.threads, "modes": {}}
    runs = {"single-stream": [compare(llm, [p], args.max_tokens) for p in batch],
            f"batch of {len(batch)}": [compare(llm, batch, args.max_tokens)]}
    for mode, parts in runs.items():
        tokens = sum(p["tokens"] for p in parts)
        free_ms = 1000 * sum(p["free_s"] for p in parts) / tokens
        json_ms = 1000 * sum(p["constrained_s"] for p in parts) / tokens
        valid = sum(p["valid"] for p in parts)
        mask_ms = sum(p["mask_ms"] * p["tokens"] for p in parts) / tokens
        row = {"output_tokens": tokens, "free_ms_per_token": free_ms, "constrained_ms_per_token": json_ms,
               "overhead_ms_per_token": json_ms - free_ms, "ratio": json_ms / free_ms, "valid": valid,
               "mask_ms_per_token": mask_ms, "requests": sum(p["requests"] for p in parts)}
        report["modes"][mode] = row
        print(f"{mode:<14}{tokens:>8}{free_ms:>13.2f}{json_ms:>13.2f}{json_ms - free_ms:>17.2f}"
              f"{row['ratio']:>7.2f}x{str(valid) + '/' + str(row['requests']):>8}{mask_ms:>13.3f}")
    return report


DIRECTIONS = {"constrained_ms_per_token": False, "overhead_ms_per_token": False, "ratio": False,
              "mask_ms_per_token": False, "free_ms_per_token": False}


def figures(report: dict) -> dict[str, dict[str, float]]:
    return {mode: {f: row[f] for f in DIRECTIONS} for mode, row in report["modes"].items()}
