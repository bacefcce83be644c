"""Disaggregated prefill/decode benchmark (issue 19). A steady stream of short streamed completions
runs while long prompts (~2k tokens) arrive in bursts. Two setups serve it on the same two cores:

- colocated: one `codeyard llm serve` using both cores (two torch threads), long prefills batched
  with the short requests' decodes (chunked prefill, 2048 tokens a step);
- disaggregated: `--role prefill` on one core, `--role decode`'s engine on the other (one thread
  each), the proxy and the decode instance's API process beside the prefill instance. The prefill
  instance takes the shortest prompt first; the decode instance pulls each prompt's KV over shared
  memory.
- disagg-local: the same with `--max-local-prefill-length 256`: the short prompts are prefilled
  on the decode instance itself, only the long ones on the prefill instance. Otherwise the short
  prompts that arrive during a burst wait behind it on the prefill instance, then reach the decode
  instance together and swell its batch.

The figures are the short requests' decode TPOT at p50 and p99 (vLLM's: per request (last token -
first token) / (tokens - 1), percentiles as numpy's, as vLLM's benchmark_serving computes them),
the p99 gap between two streamed chunks, TTFT, and goodput: short requests a second that met both
SLOs (TTFT and TPOT). Goal: TPOT p99 at least 2x lower disaggregated. Each setup's line also says
how much CPU its engine threads used and how long they waited for a CPU while runnable (other
load): a decode instance whose TPOT is high because it waited is the machine's doing. Another
line counts the decoding engine's steps by tokens (its batch; on the decode instance, steps over
1024 tokens are long prompts it computed itself after a failed pull), from its /metrics.

    python benchmarks/llm_disagg.py                       # the built-in SmolLM2-135M (GGUF, Q4_1)
    python benchmarks/llm_disagg.py --model random        # a random 4-layer Llama, hidden 256
    python benchmarks/llm_disagg.py --seconds 30 --burst-every 10 --burst 4 --long-tokens 2000
    python benchmarks/llm_disagg.py --colocated-budget 512  # also colocated with a 512-token step budget

The default model is the built-in one, because the goal is about a real model's costs: a 2k-token
prefill takes seconds on one core (~1.5 s in bfloat16, dtype=auto's choice on a CPU with native
bf16; ~4.8 s in float32) while a batch-8 decode step takes ~50 ms, so a burst
of long prompts stalls a colocated stream for seconds. The random 4-layer model (its 49k
vocabulary's LM head half of a decode step, a 2k prefill ~60 ms) made decode expensive and prefill
cheap, the opposite of real models, so it could not show what disaggregation is for. The burst
rate was chosen to leave the single-core prefill instance half idle at bfloat16's prefill cost;
in float32 (dtype=auto on a CPU without native bf16) it and the colocated server fall behind (TTFT is then queueing; a lighter rate such as
`--burst-every 30 --seconds 60` should not, unmeasured). Each server is a real `codeyard llm
serve` process (the proxy is the --disaggregated launcher's); the client runs in this process.
Run it under `flock /tmp/codeyard-bench.lock` on a shared machine: the figures move with other load.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.framework.targets import cpu_split  # noqa: E402
from llm_engine.entrypoints.disagg_servers import instance_cores  # noqa: E402
from llm_engine.entrypoints.models import builtin_model_path  # noqa: E402
from llm_engine.entrypoints.replicas import child_servers  # noqa: E402

MODEL_NAME = "disagg-bench"


def build_model(folder: Path) -> Path:
    """A random-weight Llama with SmolLM2's tokenizer: real text handling, a cheap forward pass."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

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
    sent: float = 0.0  # perf_counter() when it was sent
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
    result.sent = sent = time.perf_counter()
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


async def drive(base_url: str, key: str, arrivals: list[Arrival], warmed: Callable[[], object]) -> list[Result]:
    """Warm the server up (a short and a long request), call `warmed`, then send the schedule."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers={"Authorization": f"Bearer {key}"},
                                 limits=limits) as client:
        await send(client, Arrival(0, arrivals[0].prompt, 4, False), time.perf_counter())  # warm-up
        long_warm = next((a for a in arrivals if a.long), None)
        if long_warm is not None:
            await send(client, Arrival(0, [t + 1 for t in long_warm.prompt], 2, True), time.perf_counter())
        warmed()
        started = time.perf_counter()
        return list(await asyncio.gather(*(send(client, a, started) for a in arrivals)))


def percentile(values: list[float], q: float) -> float:
    """numpy's (linear between the two nearest ranks), as vLLM's benchmark reports percentiles."""
    return float(numpy.percentile(values, q)) if values else float("nan")


def decoding_beside(result: Result, results: list[Result]) -> float:
    """How many other requests were decoding, on average, while this one decoded (first to last
    chunk): the batch its tokens were computed in. A high TPOT beside a small batch is a stall
    (prefills in its steps); beside a large one, requests that started decoding together."""
    start, end = result.sent + result.chunk_times[0], result.sent + result.chunk_times[-1]
    overlap = sum(max(0.0, min(end, r.sent + r.chunk_times[-1]) - max(start, r.sent + r.chunk_times[0]))
                  for r in results if r is not result and len(r.chunk_times) > 1)
    return overlap / (end - start) if end > start else 0.0


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
    slowest = sorted((r for r in ok if r.tpot is not None), key=lambda r: r.tpot or 0.0)
    if slowest:
        beside = [decoding_beside(r, results) for r in slowest]
        row["decoding_beside_p50"], row["decoding_beside_slowest"] = beside[len(beside) // 2], beside[-1]
        print(f"  requests decoding beside a short request: {row['decoding_beside_p50']:.1f} for the median TPOT's, "
              f"{row['decoding_beside_slowest']:.1f} for the slowest ({1000 * (slowest[-1].tpot or 0):.1f} ms)")
    for error in errors[:3]:
        print(f"  error: {error}")
    return row


def server_processes(pid: int, label: str) -> dict[str, int]:
    """The serving processes: the colocated server itself, or the --disaggregated launcher (the
    proxy) and its two children (prefill, decode: the order it starts them in)."""
    if label.startswith("colocated"):
        return {"server": pid}
    children = sorted(int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                      for child in (task / "children").read_text().split())
    return {**dict(zip(["prefill", "decode"], children)), "proxy": pid}


def process_times(pids: dict[str, int]) -> dict[str, tuple[float, float, float]]:
    """(CPU seconds of the engine threads, of the whole process, seconds the engine threads waited
    for a CPU while runnable) of each process so far."""
    return {name: cpu_split(pid) for name, pid in pids.items()}


def cpu_line(label: str, spent: dict[str, tuple[float, float, float]], client_cpu: float, tokens: int) -> str:
    """Where the CPU went: each engine's threads and their wait for a CPU, the rest of each process
    (HTTP, streaming; all of the proxy's), and this client's. On two cores whatever is not an
    engine's runs beside the engines."""
    parts = [f"{name} {cpu:.1f} / {wait:.1f} s ({1000 * wait / max(tokens, 1):.1f} ms a token), rest of the process "
             f"{whole - cpu:.1f} s" for name, (cpu, whole, wait) in spent.items() if name != "proxy"]
    proxy = f"; proxy {spent['proxy'][1]:.1f} s" if "proxy" in spent else ""
    return (f"{label}: engine threads' CPU / wait for a CPU: " + ", ".join(parts) + proxy
            + f"; benchmark client {client_cpu:.1f} s")


STEP_SIZES = [(1, 8), (9, 16), (17, 64), (65, 1024), (1025, None)]  # tokens a step, on vllm's bucket edges


def decoding_server(pid: int, label: str, url: str, key: str) -> tuple[str, str]:
    """URL and key of the server whose steps decode the streams: the colocated one, or the decode
    instance, read from its command line (the launcher gives each child its port and key)."""
    if label.startswith("colocated"):
        return url, key
    args = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    return f"http://127.0.0.1:{args[args.index('--port') + 1]}", args[args.index("--api-key") + 1]


def steps_by_tokens(url: str, key: str) -> dict[float, float]:
    """The server's engine steps so far, cumulative by tokens a step (vllm:iteration_tokens_total's buckets)."""
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30).text
    return {float(sample.labels["le"]): sample.value for family in text_string_to_metric_families(text)
            if family.name == "vllm:iteration_tokens_total" for sample in family.samples
            if sample.name.endswith("_bucket")}


def step_sizes_line(before: dict[float, float], after: dict[float, float]) -> tuple[str, dict[str, float]]:
    """How many steps of each size the decoding engine ran during the schedule. A decode step's
    tokens are its batch (one a stream), so this is the batch the TPOT came from; on the decode
    instance, steps over 1024 tokens are long prompts computed there (a pull that failed or came
    after the prefill instance's hold expired), each a stall of every stream for a second or more."""
    def upto(tokens: float) -> float:
        return after[tokens] - before[tokens] if tokens else 0.0

    counts = {f"{low}-{high}" if high else f"over {low - 1}": upto(float(high or "inf")) - upto(float(low - 1))
              for low, high in STEP_SIZES}
    return ", ".join(f"{name} {count:.0f}" for name, count in counts.items()), counts


def run_setup(label: str, serve_args: list[str], arrivals: list[Arrival], args: argparse.Namespace) -> dict:
    """`codeyard llm serve <serve_args>` as one process (the colocated server on both cores, or
    the --disaggregated launcher, which pins its two instances itself); the client sends the
    schedule to it."""
    cores = instance_cores(pin=True)
    both = [cores[0] | cores[1]] if cores and "--disaggregated" not in serve_args else None
    with child_servers([serve_args], [label], both) as server:
        pids = server_processes(server.procs[0].pid, label)
        decoding = decoding_server(pids.get("decode", 0), label, server.urls[0], server.key)
        load_before, before, client_before = os.getloadavg()[0], process_times(pids), time.process_time()
        steps_before: list[dict[float, float]] = []
        results = asyncio.run(drive(server.urls[0], server.key, arrivals,
                                    lambda: steps_before.append(steps_by_tokens(*decoding))))
        after, client_cpu = process_times(pids), time.process_time() - client_before
        sizes, size_counts = step_sizes_line(steps_before[0], steps_by_tokens(*decoding))
    tokens = sum(r.tokens for r in results)
    spent = {name: (after[name][0] - before[name][0], after[name][1] - before[name][1], after[name][2] - before[name][2])
             for name in pids}
    if "proxy" in spent:  # cpu_split counts a process's children too: the launcher's are the instances
        spent["proxy"] = (0.0, spent["proxy"][1] - spent["prefill"][1] - spent["decode"][1], 0.0)
    print(f"{label}: load average {load_before:.1f} before the schedule, {os.getloadavg()[0]:.1f} after", flush=True)
    print(cpu_line(label, spent, client_cpu, tokens), flush=True)
    print(f"{label}: {'server' if label.startswith('colocated') else 'decode instance'} steps by tokens: {sizes}",
          flush=True)
    return {**summarize(label, results, args), "client_cpu_s": client_cpu,
            **{f"decoding_steps_{name.replace(' ', '_')}": count for name, count in size_counts.items()},
            **{f"{name}_{kind}_s": value for name, (engine, whole, wait) in spent.items()
               for kind, value in (("engine_cpu", engine), ("process_cpu", whole), ("engine_wait", wait))}}


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser) -> argparse.Namespace:
    parser.add_argument("--model", default="builtin", help="builtin (SmolLM2-135M, the default), random (a "
                        "random 4-layer Llama built here with SmolLM2's tokenizer) or a local HF folder or GGUF file")
    parser.add_argument("--seconds", type=float, default=45.0, help="length of the arrival schedule")
    parser.add_argument("--short-rate", type=float, default=2.0, help="short requests a second (Poisson)")
    parser.add_argument("--short-tokens", type=int, default=48, help="tokens each short request generates")
    parser.add_argument("--burst-every", type=float, default=15.0, help="seconds between bursts of long prompts")
    parser.add_argument("--burst", type=int, default=4, help="long prompts per burst")
    parser.add_argument("--long-tokens", type=int, default=2000, help="prompt tokens of a long request")
    parser.add_argument("--slo-ttft", type=float, default=2.0, help="seconds, for goodput")
    parser.add_argument("--slo-tpot", type=float, default=0.1, help="seconds a token, for goodput")
    parser.add_argument("--kv-transport", default="shm", choices=["shm", "socket"])
    parser.add_argument("--max-local-prefill-length", type=int, default=256,
                        help="also run disaggregated with prompts of up to this many tokens prefilled on the decode "
                             "instance (disagg-local; 0: not)")
    parser.add_argument("--colocated-budget", type=int, default=0,
                        help="also run colocated with this chunked prefill budget (--max-num-batched-tokens; the "
                             "engine's default is 2048): colocated-N, to tell whether colocated is at its best")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="codeyard-disagg-") as folder:
        model = {"builtin": lambda: str(builtin_model_path()),
                 "random": lambda: str(build_model(Path(folder)))}.get(args.model, lambda: args.model)()
        serve_args = ["--model", model, "--served-model-name", MODEL_NAME, "--kv-cache-memory", "1GiB",
                      "--max-num-seqs", "64", "--max-waiting", "512"]
        arrivals = workload(args)
        longs = sum(a.long for a in arrivals)
        print(f"{len(arrivals) - longs} short requests ({args.short_tokens} tokens each) and {longs} long prompts "
              f"of {args.long_tokens} tokens over {args.seconds:.0f} s; model {model}; cores: {instance_cores(pin=True)}")
        disaggregated = [*serve_args, "--disaggregated", "--kv-transport", args.kv_transport]
        rows = [run_setup("colocated", serve_args, arrivals, args)]
        if args.colocated_budget:
            budget = ["--max-num-batched-tokens", str(args.colocated_budget)]
            rows.append(run_setup(f"colocated-{args.colocated_budget}", [*serve_args, *budget], arrivals, args))
        rows.append(run_setup("disaggregated", disaggregated, arrivals, args))
        if args.max_local_prefill_length:
            local = [*disaggregated, "--max-local-prefill-length", str(args.max_local_prefill_length)]
            rows.append(run_setup("disagg-local", local, arrivals, args))
    for together in (row for row in rows if row["setup"].startswith("colocated")):
        for apart in (row for row in rows if row["setup"].startswith("disagg")):
            goodput = (f"{apart['goodput_rps'] / together['goodput_rps']:.2f}x" if together['goodput_rps']
                       else f"{together['setup']} met no SLO")
            print(f"TPOT p99 {together['setup']} / {apart['setup']}: "
                  f"{together['tpot_p99_ms'] / apart['tpot_p99_ms']:.2f}x (goal >= 2); goodput {apart['setup']} / "
                  f"{together['setup']}: {goodput}")
    return {"rows": rows}


DIRECTIONS = {"tpot_p99_ms": False, "tpot_p50_ms": False, "itl_p99_ms": False, "ttft_p99_ms": False,
              "goodput_rps": True}


def figures(report: dict) -> dict[str, dict[str, float]]:
    return {row["setup"]: {name: row[name] for name in DIRECTIONS} for row in report["rows"]}


if __name__ == "__main__":
    from benchmarks.__main__ import main as bench_main

    sys.exit(bench_main(["run", "disagg", *sys.argv[1:]]))
