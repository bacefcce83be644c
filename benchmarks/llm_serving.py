"""Serving benchmark in the style of vLLM's benchmark_serving: Poisson arrivals against the
OpenAI-compatible server, then the same workload through the offline API for the HTTP overhead.

    .venv/bin/python benchmarks/llm_serving.py                      # built-in SmolLM2, rates 1,2,4
    .venv/bin/python benchmarks/llm_serving.py --rates 4 --num-prompts 32 --json out.json

The server runs as `codeyard llm serve` in a subprocess (its own interpreter, as deployed); the
load generator streams /v1/completions with token-id prompts and `ignore_eos`, so every request
produces exactly its drawn output length. Per rate it prints request throughput, output tokens/s,
TTFT / TPOT / ITL p50 and p99, and goodput (requests/s whose TTFT met --ttft-slo). Last, a burst
of the same prompts goes through HTTP (all at once) and through `LLM.generate` in this process
(the offline API, no HTTP): the ratio of their output tokens/s is the HTTP layer's overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._workload import BenchRequest, percentile, random_workload  # noqa: E402

SMOLLM_VOCAB = (1000, 48000)  # ordinary tokens of SmolLM2's vocabulary (specials sit at the bottom)


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    itl: tuple[float, ...] = ()
    output_tokens: int = 0
    error: str = ""


@dataclass
class RateSummary:
    rate: str
    completed: int
    failed: int
    duration_s: float
    request_throughput: float
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    goodput: float


async def one_request(client: httpx.AsyncClient, model: str, req: BenchRequest) -> Result:
    body = {"model": model, "prompt": req.prompt_token_ids, "max_tokens": req.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first = last = None
    gaps: list[float] = []
    tokens = 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return Result(False, error=f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Result(False, error=chunk["error"]["message"])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if not chunk["choices"]:
                    continue
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    except httpx.HTTPError as exc:
        return Result(False, error=f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    if first is None:
        return Result(False, error="no output")
    return Result(True, first - start, end - start, tuple(gaps), tokens)


async def run_rate(url: str, model: str, workload: list[BenchRequest], rate: float, seed: int) -> tuple[list[Result], float]:
    """Send the workload with exponential gaps of mean 1/rate (rate inf: all at once)."""
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=1000)) as client:
        tasks = []
        start = time.perf_counter()
        for req in workload:
            tasks.append(asyncio.create_task(one_request(client, model, req)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - start


def summarize(rate: float, results: list[Result], duration: float, ttft_slo: float) -> RateSummary:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [gap for r in ok for gap in r.itl]

    def ms(values: list[float], q: float) -> float:
        return round(percentile(values, q) * 1000, 1) if values else float("nan")

    return RateSummary(
        rate="burst" if rate == float("inf") else f"{rate:g}/s", completed=len(ok), failed=len(results) - len(ok),
        duration_s=round(duration, 2), request_throughput=round(len(ok) / duration, 3),
        output_tokens_per_s=round(sum(r.output_tokens for r in ok) / duration, 1),
        ttft_p50_ms=ms(ttft, 50), ttft_p99_ms=ms(ttft, 99), tpot_p50_ms=ms(tpot, 50), tpot_p99_ms=ms(tpot, 99),
        itl_p50_ms=ms(itl, 50), itl_p99_ms=ms(itl, 99),
        goodput=round(sum(1 for t in ttft if t <= ttft_slo) / duration, 3))


def start_server(model: str | None, port: int, max_num_seqs: int) -> subprocess.Popen:
    codeyard = Path(sys.executable).parent / "codeyard"
    cmd = [str(codeyard), "llm", "serve", "--port", str(port), "--max-num-seqs", str(max_num_seqs),
           "--max-waiting", "100000", "--served-model-name", "bench"]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            proc.terminate()
            raise SystemExit("the server did not become ready in 600 s")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(1)


def offline_tokens_per_s(model_path: str, workload: list[BenchRequest], max_num_seqs: int) -> float:
    from llm_engine import LLM, SamplingParams

    llm = LLM(model_path, max_num_seqs=max_num_seqs)
    params = [SamplingParams(max_tokens=r.max_tokens, temperature=0, ignore_eos=True) for r in workload]
    llm.generate([workload[0].prompt_token_ids], params[:1], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate([r.prompt_token_ids for r in workload], params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="local HF folder or .gguf (default: the built-in SmolLM2)")
    parser.add_argument("--rates", default="1,2,4", help="request rates per second, comma separated")
    parser.add_argument("--num-prompts", type=int, default=16, help="requests per rate")
    parser.add_argument("--input-len", default="16,128", help="prompt length range low,high (tokens)")
    parser.add_argument("--output-len", default="8,32", help="output length range low,high (tokens)")
    parser.add_argument("--ttft-slo", type=float, default=1.0, help="TTFT objective for goodput, seconds")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-offline", action="store_true", help="skip the offline-API comparison")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    try:
        rates = [float(r) for r in args.rates.split(",")]
        input_len = tuple(int(x) for x in args.input_len.split(","))
        output_len = tuple(int(x) for x in args.output_len.split(","))
        workload = random_workload(args.num_prompts, *SMOLLM_VOCAB, input_len=input_len, output_len=output_len,
                                   seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))

    from llm_engine.entrypoints.models import resolve_model

    model_path, _ = resolve_model(args.model)
    print(f"model {model_path}; {args.num_prompts} requests per rate, input {input_len}, output {output_len}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    proc = start_server(model_path, args.port, args.max_num_seqs)
    url = f"http://127.0.0.1:{args.port}"
    summaries = []
    try:
        asyncio.run(run_rate(url, "bench", workload[:2], float("inf"), args.seed))  # warm-up
        for rate in [*rates, float("inf")]:
            results, duration = asyncio.run(run_rate(url, "bench", workload, rate, args.seed))
            summary = summarize(rate, results, duration, args.ttft_slo)
            summaries.append(summary)
            print(json.dumps(asdict(summary)), flush=True)
            for r in results:
                if not r.ok:
                    print("  failed:", r.error)
    finally:
        proc.terminate()
        proc.wait(60)
    report = {"summaries": [asdict(s) for s in summaries], "load_average": os.getloadavg()[0]}
    if not args.no_offline:
        offline = offline_tokens_per_s(model_path, workload, args.max_num_seqs)
        http = summaries[-1].output_tokens_per_s
        report["offline_output_tokens_per_s"] = round(offline, 1)
        report["http_vs_offline"] = round(http / offline, 3)
        print(f"burst: HTTP {http:.1f} output tok/s vs offline LLM.generate {offline:.1f} tok/s "
              f"-> HTTP/offline = {http / offline:.2f}")
    print(f"load average now {os.getloadavg()[0]:.1f} (other work on this machine skews the figures)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
