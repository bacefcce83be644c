"""Per-token cost of structured outputs (xgrammar token masks) on SmolLM2-135M-Instruct.

Each request asks the model for a JSON answer under a schema (a list of fixes for a code
snippet). The constrained run goes first; the same prompt then runs unconstrained for exactly as
many tokens (ignore_eos), so both runs decode the same number of tokens. Done one request at a
time (single stream) and as one batch. Prints ms per output token for both, the overhead per
token and the ratio, and how many constrained outputs parse and validate (they all must). On a
busy machine those end-to-end timings are noisy, so the mask work itself is also timed: the
constrained outputs are replayed through a fresh matcher, timing per token what the sampler adds
(fill the bitmask, mask a logits row).

Then the same per-token overhead under prompt-lookup speculation (masks on proposals), on a JSON
answer that copies text from the prompt (a record of a standard-library function's name, def line
and first line, to write as JSON): for each function, one engine without speculation and one with it (k=5) answer
constrained, then unconstrained for as many tokens, back to back, by the process's CPU time
(run with --threads 1 on a shared machine). Prints each engine's constrained and free CPU ms per
token, the overhead, the spec / plain ratio on the JSON answers and how many are identical
(greedy: they all must be).

    python -m benchmarks run structured              # 8 prompts, 8 copy answers
    python -m benchmarks run structured --prompts 4 --copy 4 --out out.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import jsonschema_rs
import torch

from benchmarks.suites.spec import stdlib_functions
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


COPY_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "signature", "first_line"],
               "properties": {"name": {"type": "string", "maxLength": 40},
                              "signature": {"type": "string", "maxLength": 160},
                              "first_line": {"type": "string", "maxLength": 160}}}
COPY_QUESTION = ("Write this record as a JSON object with the keys name, signature and first_line, values "
                 "copied exactly.\n\nname: {}\nsignature: {}\nfirst_line: {}")


def copy_question(function: str) -> str:
    """The question about a function's source: its name, def line and next line, to copy."""
    lines = function.splitlines()
    return COPY_QUESTION.format(lines[0].split("(")[0].removeprefix("def ").strip(), lines[0], lines[1].strip())


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def prompts(tokenizer, count: int) -> list[str]:
    question = ("List the fixes this Python code needs as JSON: {{\"fixes\": [{{\"line\", \"kind\", "
                "\"message\"}}]}}.\n\n{}")
    return [chat(tokenizer, question.format(SNIPPETS[i % len(SNIPPETS)])) for i in range(count)]


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
    mask_ms = replay_mask_ms(llm, outs, SCHEMA)
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


def cpu_run(llm, prompt: str, params) -> tuple[Any, float]:
    """The request's output and the process's CPU seconds for it."""
    cpu = time.process_time()
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    return out, time.process_time() - cpu


def copy_json(plain, spec, count: int, max_tokens: int, k: int) -> dict:
    """Constrained then free answers (as many tokens) from both engines, function by function."""
    from llm_engine import SamplingParams
    from llm_engine.structured_outputs import StructuredOutputsParams

    constrained = SamplingParams(temperature=0, max_tokens=max_tokens,
                                 structured_outputs=StructuredOutputsParams(json=COPY_SCHEMA))
    cpu = {"plain json": 0.0, "spec json": 0.0, "plain free": 0.0, "spec free": 0.0}
    tokens, identical, valid, outputs = 0, 0, 0, []
    before = spec.engine.get_stats()
    drafts = drafted = accepted = 0
    for function in stdlib_functions(count):
        prompt = chat(plain.get_tokenizer(), copy_question(function))
        ours, cpu_plain = cpu_run(plain, prompt, constrained)
        theirs, cpu_spec = cpu_run(spec, prompt, constrained)
        outputs.append(ours)
        after = spec.engine.get_stats()  # the constrained answer's drafts only
        drafts += after.spec_decode_num_drafts - before.spec_decode_num_drafts
        drafted += after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
        accepted += after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
        cpu["plain json"] += cpu_plain
        cpu["spec json"] += cpu_spec
        answer = ours.outputs[0]
        free = SamplingParams(temperature=0, max_tokens=len(answer.token_ids), ignore_eos=True)
        cpu["plain free"] += cpu_run(plain, prompt, free)[1]
        cpu["spec free"] += cpu_run(spec, prompt, free)[1]
        before = spec.engine.get_stats()
        tokens += len(answer.token_ids)
        identical += answer.token_ids == theirs.outputs[0].token_ids
        try:
            valid += jsonschema_rs.is_valid(COPY_SCHEMA, json.loads(answer.text))
        except ValueError:
            pass
    ms = {key: 1000 * seconds / tokens for key, seconds in cpu.items()}
    return {"requests": count, "output_tokens": tokens, "identical": identical, "valid": valid,
            "plain_json_cpu_ms_per_token": ms["plain json"], "plain_free_cpu_ms_per_token": ms["plain free"],
            "spec_json_cpu_ms_per_token": ms["spec json"], "spec_free_cpu_ms_per_token": ms["spec free"],
            "plain_overhead_cpu_ms_per_token": ms["plain json"] - ms["plain free"],
            "spec_overhead_cpu_ms_per_token": ms["spec json"] - ms["spec free"],
            "json_spec_ratio": cpu["plain json"] / cpu["spec json"],
            "free_spec_ratio": cpu["plain free"] / cpu["spec free"],
            "drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
            "plain_mask_ms_per_token": replay_mask_ms(plain, outputs, COPY_SCHEMA),
            "spec_mask_ms_per_token": replay_mask_ms(plain, outputs, COPY_SCHEMA, k)}


def replay_mask_ms(llm, outputs: list, schema: dict, k: int = 0) -> float:
    """Milliseconds per token of the grammar work, replaying the constrained outputs: the
    sampler's (fill a bitmask, mask a logits row) or, with k, the speculative engine's at each
    step: a prompt-lookup draft of up to k tokens checked against the grammar (check_draft), its
    verify rows copied and masked, the accepted tokens and the next one advanced through the
    matcher (drafts as the lookup finds them, without the engine's throttle: at most its work)."""
    import torch

    from llm_engine.speculative import find_ngram
    from llm_engine.structured_outputs import GrammarCompiler, StructuredOutputsParams, apply_grammar_masks

    engine = llm.engine
    compiler = GrammarCompiler(engine.tokenizer, engine.vocab_size, engine.eos_token_ids)
    grammar = compiler.compile(StructuredOutputsParams(json=schema))
    logits = torch.randn(k + 1, engine.vocab_size)
    tokens, start = 0, time.perf_counter()
    for out in outputs:
        state = grammar.new_state()
        output, ids = out.outputs[0].token_ids, list(out.prompt_token_ids)
        while len(ids) < len(out.prompt_token_ids) + len(output):
            done = len(ids) - len(out.prompt_token_ids)
            match = find_ngram(ids, 4, 1) if k else None
            draft = state.check_draft(ids[match.start:match.start + k]) if match else []
            if draft:
                state.mask_draft_rows(logits[:len(draft) + 1].clone())
            else:
                apply_grammar_masks(logits, [0], [state])
            accepted = 0
            while (accepted < len(draft) and done + accepted < len(output)
                   and draft[accepted] == output[done + accepted]):
                accepted += 1
            step = min(accepted + 1, len(output) - done)  # the accepted tokens and the target's next
            for token in output[done:done + step]:
                state.accept(token)
            ids += output[done:done + step]
        tokens += len(output)
    return 1000 * (time.perf_counter() - start) / tokens


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser) -> argparse.Namespace:
    parser.add_argument("--model", type=Path, help="local HF folder or .gguf (default: the built-in SmolLM2)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--copy", type=int, default=8, help="JSON answers copying a function, with and without speculation")
    parser.add_argument("--k", type=int, default=5, help="num_speculative_tokens of the speculative engine")
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
    if args.copy:
        report["copy"] = copy_report(llm, str(gguf), args)
    return report


def copy_report(plain, model: str, args: argparse.Namespace) -> dict:
    """The copy workload on `plain` and a speculative engine of the same model."""
    from llm_engine import LLM

    spec_config = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    spec = LLM(model=model, kv_cache_memory="256MiB", num_threads=args.threads,
               enable_prefix_caching=False, speculative_config=spec_config)
    load = os.getloadavg()[0]
    row = copy_json(plain, spec, args.copy, args.max_tokens, args.k) | {"load_before": load, "load_after": os.getloadavg()[0]}
    print(f"copy JSON ({row['requests']} functions, {row['output_tokens']} tokens, speculative_config {spec_config}, "
          f"load {load:.1f} -> {row['load_after']:.1f}), CPU ms per token:")
    for engine in ("plain", "spec"):
        print(f"  {engine:<6} json {row[f'{engine}_json_cpu_ms_per_token']:.2f}  free {row[f'{engine}_free_cpu_ms_per_token']:.2f}"
              f"  overhead {row[f'{engine}_overhead_cpu_ms_per_token']:+.2f}  mask work (replayed) "
              f"{row[f'{engine}_mask_ms_per_token']:.3f}")
    print(f"  spec / plain: json {row['json_spec_ratio']:.2f}x, free {row['free_spec_ratio']:.2f}x; "
          f"accepted/drafted {row['accepted_tokens']}/{row['draft_tokens']} in {row['drafts']} drafts; "
          f"identical {row['identical']}/{row['requests']}, valid {row['valid']}/{row['requests']}")
    return row


DIRECTIONS = {"constrained_ms_per_token": False, "overhead_ms_per_token": False, "ratio": False,
              "mask_ms_per_token": False, "free_ms_per_token": False, "spec_json_cpu_ms_per_token": False,
              "spec_overhead_cpu_ms_per_token": False, "json_spec_ratio": True,
              "spec_mask_ms_per_token": False}


def figures(report: dict) -> dict[str, dict[str, float]]:
    found = {mode: {f: row[f] for f in DIRECTIONS if f in row} for mode, row in report["modes"].items()}
    if "copy" in report:
        found["copy"] = {f: report["copy"][f] for f in DIRECTIONS if f in report["copy"]}
    return found
