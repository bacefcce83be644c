"""Disaggregated prefill/decode benchmark (issue 19). A steady stream of short streamed completions
runs while long prompts (~2k tokens) arrive in bursts. Two setups serve it on the same two cores:

- colocated: one `codeyard llm serve` using both cores, long prefills batched with the short
  requests' decodes (chunked prefill, 2048 tokens a step);
- disaggregated: `--role prefill` on one core, `--role decode` on the other, the proxy in front.
  The decode instance pulls each prompt's KV over shared memory.

The figures are the short requests' decode TPOT ((last token - first token) / (tokens - 1)) at p50
and p99, the p99 gap between two streamed chunks, TTFT, and goodput: short requests a second that
met both SLOs (TTFT and TPOT). Goal: TPOT p99 at least 2x lower disaggregated.

    python benchmarks/llm_disagg.py                       # a random Llama (SmolLM2's tokenizer)
    python benchmarks/llm_disagg.py --seconds 30 --burst-every 4 --burst 2 --long-tokens 2000

The model is built on the spot with random weights (4 layers, hidden 256), so a 2k-token prefill
costs a few hundred ms on one core and a decode step a few ms. Each server is a real
`codeyard llm serve` process (the proxy is the --disaggregated launcher's); the client runs in
this process. Run it under
`flock /tmp/codeyard-bench.lock` on a shared machine: the figures move with other load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llm_engine.entrypoints.disagg_servers import instance_cores  # noqa: E402
from llm_engine.entrypoints.replicas import child_servers  # noqa: E402

MODEL_NAME = "disagg-bench"


def build_model(folder: Path) -> Path:
    """A random-weight Llama with SmolLM2's tokenizer: real text handling, a cheap forward pass."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from llm_engine.entrypoints.models import builtin_model_path
    from llm_engine.loader.gguf_conversion import config_and_tokenizer

    gguf = builtin_model_path()
    tokenizer = config_and_tokenizer(gguf)[1]
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@dataclass
class Arrival:
    at: float  # seconds after the start
    prompt: list[int]
    max_tokens: int
    long: bool


@dataclass
class Result:
    arrival: Arrival
    chunk_times: list[float] = field(default_factory=list)  # seconds after the request was sent
    tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.chunk_times[0]

    @property
    def tpot(self) -> float | None:
        if self.tokens < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.tokens - 1)


def workload(args: argparse.Namespace) -> list[Arrival]:
    """Short requests as a Poisson stream; long prompts in bursts every --burst-every seconds."""
    rng = random.Random(args.seed)
    arrivals, t = [], 0.0
    while (t := t + rng.expovariate(args.short_rate)) < args.seconds:
        prompt = [rng.randrange(1000, 40000) for _ in range(rng.randrange(24, 64))]
        arrivals.append(Arrival(t, prompt, args.short_tokens, long=False))
    burst_at = args.burst_every / 2
    while burst_at < args.seconds:
        for _ in range(args.burst):
            prompt = [rng.randrange(1000, 40000) for _ in range(args.long_tokens)]
            arrivals.append(Arrival(burst_at, prompt, 4, long=True))
        burst_at += args.burst_every
    return sorted(arrivals, key=lambda a: a.at)


async def send(client: httpx.AsyncClient, arrival: Arrival, started: float) -> Result:
    await asyncio.sleep(max(0.0, started + arrival.at - time.perf_counter()))
    result = Result(arrival)
    sent = time.perf_counter()
    body = {"model": MODEL_NAME, "prompt": arrival.prompt, "max_tokens": arrival.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with client.stream("POST", "/v1/completions", json=body) as answer:
            if answer.status_code != 200:
                result.error = f"HTTP {answer.status_code}: {(await answer.aread())[:200]!r}"
                return result
            async for line in answer.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    result.error = event["error"]["message"]
                elif event.get("choices"):
                    result.chunk_times.append(time.perf_counter() - sent)
                elif event.get("usage"):
                    result.tokens = event["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def drive(base_url: str, key: str, arrivals: list[Arrival]) -> list[Result]:
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers={"Authorization": f"Bearer {key}"},
                                 limits=limits) as client:
        await send(client, Arrival(0, arrivals[0].prompt, 4, False), time.perf_counter())  # warm-up
        long_warm = next((a for a in arrivals if a.long), None)
        if long_warm is not None:
            await send(client, Arrival(0, [t + 1 for t in long_warm.prompt], 2, True), time.perf_counter())
        started = time.perf_counter()
        return list(await asyncio.gather(*(send(client, a, started) for a in arrivals)))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def summarize(label: str, results: list[Result], args: argparse.Namespace) -> dict:
    short = [r for r in results if not r.arrival.long]
    ok = [r for r in short if r.error is None and r.chunk_times]
    errors = [r.error for r in results if r.error]
    tpots = [t for r in ok if (t := r.tpot) is not None]
    gaps = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    good = [r for r in ok if r.ttft <= args.slo_ttft and (r.tpot or 0.0) <= args.slo_tpot]
    longs = [r for r in results if r.arrival.long]
    row = {"setup": label, "short_requests": len(short), "long_requests": len(longs), "errors": len(errors),
           "tpot_p50_ms": 1000 * statistics.median(tpots) if tpots else float("nan"),
           "tpot_p99_ms": 1000 * percentile(tpots, 99), "itl_p99_ms": 1000 * percentile(gaps, 99),
           "ttft_p50_ms": 1000 * statistics.median([r.ttft for r in ok]) if ok else float("nan"),
           "ttft_p99_ms": 1000 * percentile([r.ttft for r in ok], 99),
           "long_ttft_p50_ms": 1000 * statistics.median([r.ttft for r in longs if r.chunk_times] or [float("nan")]),
           "goodput_rps": len(good) / args.seconds, "slo_met": len(good) / len(short) if short else 0.0}
    print(f"{label:<15} TPOT p50 {row['tpot_p50_ms']:7.1f} ms  p99 {row['tpot_p99_ms']:7.1f} ms  "
          f"chunk gap p99 {row['itl_p99_ms']:7.1f} ms  TTFT p50 {row['ttft_p50_ms']:7.1f} ms  "
          f"p99 {row['ttft_p99_ms']:7.1f} ms  long TTFT p50 {row['long_ttft_p50_ms']:7.1f} ms  "
          f"goodput {row['goodput_rps']:5.2f} req/s ({row['slo_met']:.0%} met the SLOs)  errors {len(errors)}",
          flush=True)
    for error in errors[:3]:
        print(f"  error: {error}")
    return row


def run_setup(label: str, serve_args: list[str], arrivals: list[Arrival], args: argparse.Namespace) -> dict:
    """`codeyard llm serve <serve_args>` as one process (the colocated server on both cores, or
    the --disaggregated launcher, which pins its two instances itself); the client sends the
    schedule to it."""
    cores = instance_cores(pin=True)
    both = [cores[0] | cores[1]] if cores and "--disaggregated" not in serve_args else None
    with child_servers([serve_args], [label], both) as server:
        load_before = os.getloadavg()[0]
        results = asyncio.run(drive(server.urls[0], server.key, arrivals))
    print(f"{label}: load average {load_before:.1f} before the schedule, {os.getloadavg()[0]:.1f} after "
          "(others' load slows the colocated server's two-thread steps most)", flush=True)
    return summarize(label, results, args)


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser) -> argparse.Namespace:
    parser.add_argument("--model", help="local HF folder (default: a random 4-layer Llama built here)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the arrival schedule")
    parser.add_argument("--short-rate", type=float, default=3.0, help="short requests a second (Poisson)")
    parser.add_argument("--short-tokens", type=int, default=48, help="tokens each short request generates")
    parser.add_argument("--burst-every", type=float, default=4.0, help="seconds between bursts of long prompts")
    parser.add_argument("--burst", type=int, default=2, help="long prompts per burst")
    parser.add_argument("--long-tokens", type=int, default=2000, help="prompt tokens of a long request")
    parser.add_argument("--slo-ttft", type=float, default=2.0, help="seconds, for goodput")
    parser.add_argument("--slo-tpot", type=float, default=0.05, help="seconds a token, for goodput")
    parser.add_argument("--kv-transport", default="shm", choices=["shm", "socket"])
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="codeyard-disagg-") as folder:
        model = args.model or str(build_model(Path(folder)))
        serve_args = ["--model", model, "--served-model-name", MODEL_NAME, "--kv-cache-memory", "512MiB",
                      "--max-num-seqs", "64", "--max-waiting", "512"]
        arrivals = workload(args)
        longs = sum(a.long for a in arrivals)
        print(f"{len(arrivals) - longs} short requests ({args.short_tokens} tokens each) and {longs} long prompts "
              f"of {args.long_tokens} tokens over {args.seconds:.0f} s; cores: {instance_cores(pin=True)}")
        disaggregated = [*serve_args, "--disaggregated", "--kv-transport", args.kv_transport]
        rows = [run_setup("colocated", serve_args, arrivals, args),
                run_setup("disaggregated", disaggregated, arrivals, args)]
    together, apart = rows
    goodput = (f"{apart['goodput_rps'] / together['goodput_rps']:.2f}x" if together['goodput_rps']
               else "colocated met no SLO")
    print(f"TPOT p99 colocated / disaggregated: {together['tpot_p99_ms'] / apart['tpot_p99_ms']:.2f}x (goal >= 2); "
          f"goodput disaggregated / colocated: {goodput}")
    return {"rows": rows}


DIRECTIONS = {"tpot_p99_ms": False, "tpot_p50_ms": False, "itl_p99_ms": False, "ttft_p99_ms": False,
              "goodput_rps": True}


def figures(report: dict) -> dict[str, dict[str, float]]:
    return {row["setup"]: {name: row[name] for name in DIRECTIONS} for row in report["rows"]}


if __name__ == "__main__":
    from benchmarks.__main__ import main as bench_main

    sys.exit(bench_main(["run", "disagg", *sys.argv[1:]]))
