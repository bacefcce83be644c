"""Serving benchmark in the style of vLLM's benchmark_serving, now the framework's `poisson` workload:
Poisson arrivals at each rate and then all at once, against `codeyard llm serve` over /v1, and the
same requests through the engine in this process (offline) for the HTTP overhead.

    .venv/bin/python benchmarks/llm_serving.py                      # built-in SmolLM2, rates 1,2,4
    .venv/bin/python benchmarks/llm_serving.py --rates 4 --num-prompts 32 --json out.json

is `python -m benchmarks run poisson --targets offline,v1 --set rates=... --set num_requests=...`;
add `--targets offline,v1,v2,grpc` there for the other protocols (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.__main__ import main as bench  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="local HF folder or .gguf (default: the built-in SmolLM2)")
    parser.add_argument("--rates", default="1,2,4", help="request rates per second, comma separated")
    parser.add_argument("--num-prompts", type=int, default=16, help="requests per rate")
    parser.add_argument("--ttft-slo", type=float, default=1.0, help="TTFT objective for goodput, seconds")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-offline", action="store_true", help="skip the offline comparison")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    argv = ["run", "poisson", "--targets", "v1" if args.no_offline else "offline,v1", "--repeats", "1",
            "--set", f"rates={args.rates},", "--set", f"num_requests={args.num_prompts}",
            "--ttft-slo-ms", str(args.ttft_slo * 1000), "--max-num-seqs", str(args.max_num_seqs),
            "--seed", str(args.seed)]
    argv += ["--model", args.model] if args.model else []
    argv += ["--out", args.json] if args.json else []
    return bench(argv)


if __name__ == "__main__":
    sys.exit(main())
