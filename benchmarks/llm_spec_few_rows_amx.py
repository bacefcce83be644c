"""The speculative-decoding suite's requests (benchmarks/suites/spec.py: code edits, free text) with a
bfloat16 model's int4 decode rows on the float32 few-row kernel and on the AMX bf16 few-row kernel
(CODEYARD_FEW_ROWS_AMX=1, csrc/quant_gemm.cpp), alternated request by request in one process so
both modes see the same machine load.

Engines: a plain and a speculative engine per mode, so each serves each prompt once (a bf16
prompt recomputed after a prefix-cache hit rounds otherwise than a whole one) and each speculative
engine learns its own step costs (the throttle's VerifyCost). Process CPU time per output token;
greedy outputs compared within a mode (speculative against plain: must be identical) and across
modes (bf16 roundings: may differ).

Usage: .venv/bin/python benchmarks/llm_spec_few_rows_amx.py [--code-edits 8] [--free-text 6]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.suites.spec import run_one, workloads  # noqa: E402
from benchmarks.suites.throughput import find_smollm2_gguf  # noqa: E402
from llm_engine import LLM  # noqa: E402

FLAGS = {"float32 kernel": "0", "AMX bf16 tiles": "1"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code-edits", type=int, default=8)
    parser.add_argument("--free-text", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()
    common = dict(model=str(find_smollm2_gguf()), kv_cache_memory="256MiB", num_threads=1, dtype="auto")
    spec_config = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    plains = {mode: LLM(**common) for mode in FLAGS}
    specs = {mode: LLM(**common, speculative_config=spec_config) for mode in FLAGS}
    loads = workloads(plains["float32 kernel"].get_tokenizer(), args)
    for mode, flag in FLAGS.items():  # warm-up, outside the timings
        os.environ["CODEYARD_FEW_ROWS_AMX"] = flag
        run_one(plains[mode], loads["code-edit"][0][0], 16)
        run_one(specs[mode], loads["code-edit"][0][0], 16)
    print(f"load (1/5/15 min) at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for name, requests in loads.items():
        cpu = {(mode, kind): 0.0 for mode in FLAGS for kind in ("plain", "spec")}
        tokens, identical, across = dict.fromkeys(FLAGS, 0), dict.fromkeys(FLAGS, 0), 0
        for prompt, max_tokens in requests:
            outputs = {}
            for mode, flag in FLAGS.items():
                os.environ["CODEYARD_FEW_ROWS_AMX"] = flag
                ours, _, _, c_plain = run_one(plains[mode], prompt, max_tokens)
                theirs, _, _, c_spec = run_one(specs[mode], prompt, max_tokens)
                cpu[mode, "plain"] += c_plain
                cpu[mode, "spec"] += c_spec
                identical[mode] += ours == theirs
                outputs[mode] = ours
                tokens[mode] += len(ours)  # each mode's own outputs (the modes may differ)
            across += outputs["float32 kernel"] == outputs["AMX bf16 tiles"]
        ms = {(mode, kind): 1000 * value / tokens[mode] for (mode, kind), value in cpu.items()}
        base = ms["float32 kernel", "plain"]
        print(f"\n{name}: {len(requests)} requests, {' / '.join(str(n) for n in tokens.values())} tokens, "
              f"outputs equal across modes {across}/{len(requests)}")
        for mode in FLAGS:
            print(f"  {mode:<15} plain {ms[mode, 'plain']:6.2f} CPU ms/token ({base / ms[mode, 'plain']:.2f}x), "
                  f"speculative {ms[mode, 'spec']:6.2f} ({base / ms[mode, 'spec']:.2f}x the float plain engine, "
                  f"{ms[mode, 'plain'] / ms[mode, 'spec']:.2f}x its own plain), identical {identical[mode]}/{len(requests)}")
    os.environ.pop("CODEYARD_FEW_ROWS_AMX", None)
    print(f"load (1/5/15 min) at end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
