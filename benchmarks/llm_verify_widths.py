"""What a fused decode step of 1-8 rows costs (one sequence verifying a draft: the VerifyCost
table), with a bfloat16 model's int4 layers on the float32 few-row kernel and on the AMX bf16
few-row kernel (CODEYARD_FEW_ROWS_AMX=1, csrc/quant_gemm.cpp), alternated in one process.

Thread CPU time per step (one thread; medians over rounds), each width as x of the float kernel's
one-token step.
The built-in model (SmolLM2 Q4_1, int4 g32 layers and a Q8_0 head; the head is not in the stack).

`--perplexity N`: also each mode's perplexity on N tokens of stdlib Python source (the throughput
suite's text), scored through the fused step itself, teacher-forced 8 rows a step in windows of 256
tokens (the perplexity suite scores the prompt path, which this opt-in does not touch).

Usage: .venv/bin/python benchmarks/llm_verify_widths.py [--rounds 5] [--context 290] [--perplexity 2048]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.suites.throughput import python_source_tokens  # noqa: E402
from llm_engine import LLM  # noqa: E402
from llm_engine.entrypoints.models import builtin_model_path  # noqa: E402

WIDTHS = range(1, 9)
MODES = {"float32 kernel": "0", "AMX bf16 tiles": "1"}


def decode_perplexity(runner, ids: list[int], window: int = 256, rows: int = 8) -> float:
    """exp(mean NLL) of each token given the ones before it in its window, through the fused step."""
    nll, count, stack = 0.0, 0, runner.decode_stack
    for start in range(0, len(ids) - 1, window):
        part = ids[start:start + window]
        table = list(range(len(part) // stack._model.block_size + 2))
        for first in range(0, len(part) - 1, rows):
            chunk = part[first:first + rows]
            logits = runner._lm.compute_logits(stack(chunk, first, table)).float()
            targets = part[first + 1:first + 1 + len(chunk)]
            logprobs = F.log_softmax(logits[:len(targets)], dim=-1)
            nll -= float(logprobs[torch.arange(len(targets)), torch.tensor(targets)].sum())
            count += len(targets)
    return math.exp(nll / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--context", type=int, default=290, help="tokens already in the sequence's cache")
    parser.add_argument("--steps", type=int, default=6, help="steps per width, mode and round")
    parser.add_argument("--perplexity", type=int, default=0, metavar="TOKENS")
    args = parser.parse_args()
    llm = LLM(model=str(builtin_model_path()), dtype="bfloat16", num_threads=1, enable_prefix_caching=False)
    stack = llm.engine.model_runner.decode_stack
    if stack is None:
        raise SystemExit("this engine has no fused decode step")
    block = stack._model.block_size
    table = list(range((args.context + 16) // block + 2))
    tokens = [int(t) for t in torch.randint(100, 10000, (args.context + 8,), generator=torch.Generator().manual_seed(0))]
    seconds = {(mode, width): [] for mode in MODES for width in WIDTHS}
    with torch.inference_mode():
        for start in range(0, args.context, 8):  # fill the cache (8 rows a step)
            stack(tokens[start:start + 8], start, table)
        for _ in range(args.rounds):
            for width in WIDTHS:
                for mode, flag in MODES.items():
                    os.environ["CODEYARD_FEW_ROWS_AMX"] = flag
                    started = time.thread_time()
                    for _ in range(args.steps):
                        stack(tokens[args.context:args.context + width], args.context, table)
                    seconds[mode, width].append((time.thread_time() - started) / args.steps)
    os.environ.pop("CODEYARD_FEW_ROWS_AMX", None)
    one = statistics.median(seconds["float32 kernel", 1])
    print(f"load (1/5/15 min): {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print("rows  " + "  ".join(f"{mode:>24}" for mode in MODES) + "   amx/float")
    for width in WIDTHS:
        best = {mode: statistics.median(seconds[mode, width]) for mode in MODES}
        cells = "  ".join(f"{1000 * best[m]:8.2f} ms ({best[m] / one:4.2f}x)     " for m in MODES)
        print(f"{width:>4}  {cells}   {best['AMX bf16 tiles'] / best['float32 kernel']:.2f}")
    if args.perplexity:
        ids = python_source_tokens(llm.get_tokenizer(), args.perplexity)
        with torch.inference_mode():
            for mode, flag in MODES.items():
                os.environ["CODEYARD_FEW_ROWS_AMX"] = flag
                print(f"perplexity, {mode}: {decode_perplexity(llm.engine.model_runner, ids):.4f} ({len(ids)} tokens)")
        os.environ.pop("CODEYARD_FEW_ROWS_AMX", None)


if __name__ == "__main__":
    main()
