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

The short requests come at 5 a second (a class of 200, each asking for a completion every 40 s on
average), so that a burst finds some decoding: a burst that catches none measures nothing about
stalls. At 2 a second (the default before 3 Dec) a short request decoded for ~0.55-0.7 s and 22-33%
of the bursts found none decoding (40 seeds' schedules); at 5, 1-7% do, with ~3 decoding at a
burst's start on average. The rate was chosen for that, not for the ratio; `--short-rate 2` gives
the old workload. At 5 a second the decode core is busy nearly all the time (a batch of ~3.5), so
under other load (load average 3-4) both setups fall behind: the figures then are queueing.

A p99 of one 45 s schedule is about its second slowest request, and colocated's slow ones are the
few a burst catches while they decode, so the schedule runs --rounds times (a new seed each, the
setups' order alternated, every server kept up across rounds) and the figures pool the rounds.
Each ratio comes with each round's value and a 90% interval from a paired block bootstrap over
(round, burst period) blocks (`llm_disagg_analysis.py`); the goal's verdict is "met" only when
the interval's low end is >= 2. The servers' engine loops write a step trace (CODEYARD_STEP_TRACE),
and the slowest requests of each setup are broken down into the steps they decoded in.

    python benchmarks/llm_disagg.py                       # the built-in SmolLM2-135M (GGUF, Q4_1)
    python benchmarks/llm_disagg.py --model random        # a random 4-layer Llama, hidden 256
    python benchmarks/llm_disagg.py --seconds 30 --burst-every 10 --burst 4 --long-tokens 2000
    python benchmarks/llm_disagg.py --colocated-budget 256,512,1024  # also colocated with these step budgets
    python benchmarks/llm_disagg.py --colocated-budget 512 --max-local-prefill-length 0 --rounds 4  # ~10 min quiet
    python benchmarks/llm_disagg.py --disaggregated-budget 2048 --keep /tmp/disagg  # A/B: whole-prompt prefill steps; keep the traces

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
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.framework.targets import cpu_split  # noqa: E402
from benchmarks.llm_disagg_analysis import (  # noqa: E402
    Span,
    block_bootstrap_ratio,
    cpu_per_token,
    percentile,
    span_line,
    spread,
    steps_line,
    verdict,
)
from llm_engine import step_trace  # noqa: E402
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
    round: int = 0
    chunk_times: list[float] = field(default_factory=list)  # seconds after the request was sent
    sent: float = 0.0  # perf_counter() when it was sent
    sent_wall: float = 0.0  # time.time() then, to line the chunks up with the engine's step trace
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

    def span(self) -> Span:
        return Span(self.sent_wall + self.chunk_times[0], self.sent_wall + self.chunk_times[-1], self.tokens)


def workload(args: argparse.Namespace, seed: int) -> list[Arrival]:
    """Short requests as a Poisson stream; long prompts in bursts every --burst-every seconds."""
    rng = random.Random(seed)
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


async def send(client: httpx.AsyncClient, arrival: Arrival, started: float, round_: int = 0) -> Result:
    await asyncio.sleep(max(0.0, started + arrival.at - time.perf_counter()))
    result = Result(arrival, round_)
    result.sent_wall, result.sent = time.time(), time.perf_counter()
    sent = result.sent
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


async def drive(base_url: str, key: str, arrivals: list[Arrival], round_: int, warm: bool,
                warmed: Callable[[], object]) -> list[Result]:
    """Warm the server up on its first round (a short and a long request), call `warmed`, then
    send the schedule."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers={"Authorization": f"Bearer {key}"},
                                 limits=limits) as client:
        if warm:
            await send(client, Arrival(0, [t + 1 for t in arrivals[0].prompt], 4, False), time.perf_counter())
            long_warm = next((a for a in arrivals if a.long), None)
            if long_warm is not None:
                await send(client, Arrival(0, [t + 1 for t in long_warm.prompt], 2, True), time.perf_counter())
        warmed()
        started = time.perf_counter()
        return list(await asyncio.gather(*(send(client, a, started, round_) for a in arrivals)))


def decoding_beside(result: Result, results: list[Result]) -> float:
    """How many other requests of its round were decoding, on average, while this one decoded
    (first to last chunk): the batch its tokens were computed in. A high TPOT beside a small batch
    is a stall (prefills in its steps); beside a large one, requests that started decoding together."""
    start, end = result.sent + result.chunk_times[0], result.sent + result.chunk_times[-1]
    overlap = sum(max(0.0, min(end, r.sent + r.chunk_times[-1]) - max(start, r.sent + r.chunk_times[0]))
                  for r in results if r is not result and r.round == result.round and len(r.chunk_times) > 1)
    return overlap / (end - start) if end > start else 0.0


def short_ok(results: list[Result]) -> list[Result]:
    return [r for r in results if not r.arrival.long and r.error is None and r.chunk_times]


def summarize(label: str, results: list[Result], rounds: int, args: argparse.Namespace) -> dict:
    """The pooled figures over every round, and the spread of each round's TPOT p99."""
    short = [r for r in results if not r.arrival.long]
    ok = short_ok(results)
    errors = [r.error for r in results if r.error]
    tpots = [t for r in ok if (t := r.tpot) is not None]
    gaps = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    good = [r for r in ok if r.ttft <= args.slo_ttft and (r.tpot or 0.0) <= args.slo_tpot]
    longs = [r for r in results if r.arrival.long]
    per_round = spread([1000 * percentile(ts, 99) for n in range(rounds)
                        if (ts := [t for r in ok if r.round == n and (t := r.tpot) is not None])])
    row = {"setup": label, "short_requests": len(short), "long_requests": len(longs), "errors": len(errors),
           "tpot_p50_ms": 1000 * statistics.median(tpots) if tpots else float("nan"),
           "tpot_p99_ms": 1000 * percentile(tpots, 99), "tpot_max_ms": 1000 * max(tpots, default=float("nan")),
           "tpot_p99_round_median_ms": per_round.median, "tpot_p99_round_min_ms": per_round.low,
           "tpot_p99_round_max_ms": per_round.high, "itl_p99_ms": 1000 * percentile(gaps, 99),
           "ttft_p50_ms": 1000 * statistics.median([r.ttft for r in ok]) if ok else float("nan"),
           "ttft_p99_ms": 1000 * percentile([r.ttft for r in ok], 99),
           "long_ttft_p50_ms": 1000 * statistics.median([r.ttft for r in longs if r.chunk_times] or [float("nan")]),
           "goodput_rps": len(good) / (rounds * args.seconds), "slo_met": len(good) / len(short) if short else 0.0}
    print(f"{label:<15} TPOT p50 {row['tpot_p50_ms']:7.1f} ms  p99 {row['tpot_p99_ms']:7.1f} ms (rounds' p99 "
          f"{per_round.text(' ms')}; max {row['tpot_max_ms']:.1f})  chunk gap p99 {row['itl_p99_ms']:7.1f} ms  "
          f"TTFT p50 {row['ttft_p50_ms']:7.1f} ms  p99 {row['ttft_p99_ms']:7.1f} ms  long TTFT p50 "
          f"{row['long_ttft_p50_ms']:7.1f} ms  goodput {row['goodput_rps']:5.2f} req/s ({row['slo_met']:.0%} met the "
          f"SLOs)  errors {len(errors)}", flush=True)
    slowest = sorted((r for r in ok if r.tpot is not None), key=lambda r: r.tpot or 0.0)
    if slowest:
        beside = [decoding_beside(r, results) for r in slowest]
        row["decoding_beside_p50"], row["decoding_beside_slowest"] = beside[len(beside) // 2], beside[-1]
        print(f"  requests decoding beside a short request: {row['decoding_beside_p50']:.1f} for the median TPOT's, "
              f"{row['decoding_beside_slowest']:.1f} for the slowest ({1000 * (slowest[-1].tpot or 0):.1f} ms)")
    for error in errors[:3]:
        print(f"  error: {error}")
    return row


def tpots_by_block(results: list[Result], burst_every: float) -> dict[tuple[int, int], list[float]]:
    """The short requests' TPOTs by (round, burst period of their arrival): the bootstrap's blocks."""
    blocks: dict[tuple[int, int], list[float]] = {}
    for r in short_ok(results):
        if (tpot := r.tpot) is not None:
            blocks.setdefault((r.round, int(r.arrival.at // burst_every)), []).append(tpot)
    return blocks


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


@dataclass
class Setup:
    """One way of serving the schedule, its server kept up across rounds, and what it measured."""

    label: str
    serve_args: list[str]
    pids: dict[str, int] = field(default_factory=dict)
    url: str = ""
    decoding: tuple[str, str] = ("", "")  # URL and key of the server whose engine decodes the streams
    engine_pid: int = 0  # that server's engine-core process (its step trace)
    results: list[Result] = field(default_factory=list)
    spent: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    client_cpu: float = 0.0
    size_counts: dict[str, float] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    loads: list[tuple[float, float]] = field(default_factory=list)

    @property
    def colocated(self) -> bool:
        return self.label.startswith("colocated")

    def attach(self, pid: int, url: str, key: str) -> None:
        self.pids, self.url = server_processes(pid, self.label), url
        self.decoding = decoding_server(self.pids.get("decode", 0), self.label, url, key)
        decoding_pid = self.pids["server" if self.colocated else "decode"]
        self.engine_pid = next(iter(children(decoding_pid)), 0)


def children(pid: int) -> list[int]:
    return sorted(int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                  for child in (task / "children").read_text().split())


def run_round(setup: Setup, arrivals: list[Arrival], round_: int, key: str, trace: Path,
              args: argparse.Namespace) -> None:
    """Send one round's schedule to the setup's server; add its results, CPU, steps."""
    load_before, before, client_before = os.getloadavg()[0], process_times(setup.pids), time.process_time()
    steps_before: list[dict[float, float]] = []
    window: list[float] = []
    results = asyncio.run(drive(setup.url, key, arrivals, round_, warm=round_ == 0, warmed=lambda: (
        steps_before.append(steps_by_tokens(*setup.decoding)), window.append(time.time()))))
    window.append(time.time())
    after, client_cpu = process_times(setup.pids), time.process_time() - client_before
    setup.size_counts = {name: setup.size_counts.get(name, 0.0) + count for name, count in
                         step_sizes_line(steps_before[0], steps_by_tokens(*setup.decoding))[1].items()}
    for name in setup.pids:
        old = setup.spent.get(name, (0.0, 0.0, 0.0))
        setup.spent[name] = tuple(o + a - b for o, a, b in zip(old, after[name], before[name]))  # type: ignore[assignment]
    setup.client_cpu += client_cpu
    setup.results.extend(results)
    setup.loads.append((load_before, os.getloadavg()[0]))
    trace_file = trace / f"steps-{setup.engine_pid}.jsonl"
    if trace_file.exists():
        setup.steps.extend(s for s in step_trace.read(trace_file) if window[0] <= s["t"] <= window[1])
    tpots = [t for r in short_ok(results) if (t := r.tpot) is not None]
    print(f"  round {round_ + 1} {setup.label}: TPOT p50 {1000 * percentile(tpots, 50):.1f} / p99 "
          f"{1000 * percentile(tpots, 99):.1f} ms, errors {sum(1 for r in results if r.error)}, load average "
          f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)


def keep_requests(path: Path, setups: list[Setup]) -> None:
    """Every request's setup, round, arrival, and chunk times (time.time()), one JSON line each."""
    with path.open("w", encoding="utf-8") as out:
        for setup in setups:
            for r in setup.results:
                out.write(json.dumps({"setup": setup.label, "engine_pid": setup.engine_pid, "round": r.round,
                                      "at": r.arrival.at, "long": r.arrival.long, "tokens": r.tokens,
                                      "error": r.error, "chunks": [r.sent_wall + c for c in r.chunk_times]}) + "\n")


def report_setup(setup: Setup, rounds: int, args: argparse.Namespace) -> dict:
    spent = dict(setup.spent)
    if "proxy" in spent:  # cpu_split counts a process's children too: the launcher's are the instances
        spent["proxy"] = (0.0, spent["proxy"][1] - spent["prefill"][1] - spent["decode"][1], 0.0)
    tokens = sum(r.tokens for r in setup.results)
    loads = ", ".join(f"{a:.1f}-{b:.1f}" for a, b in setup.loads)
    print(f"{setup.label}: load average before-after each round {loads}", flush=True)
    print(cpu_line(setup.label, spent, setup.client_cpu, tokens), flush=True)
    sizes = ", ".join(f"{name} {count:.0f}" for name, count in setup.size_counts.items())
    print(f"{setup.label}: {'server' if setup.colocated else 'decode instance'} steps by tokens: {sizes}", flush=True)
    print(f"{setup.label}: {'server' if setup.colocated else 'decode instance'} engine: {steps_line(setup.steps)}",
          flush=True)
    row = summarize(setup.label, setup.results, rounds, args)
    slowest = sorted((r for r in short_ok(setup.results) if r.tpot is not None), key=lambda r: r.tpot or 0.0)
    cpus = [1000 * c for r in slowest if (c := cpu_per_token(r.span(), setup.steps)) is not None]
    if cpus:
        row["engine_cpu_a_token_p50_ms"], row["engine_cpu_a_token_p99_ms"] = percentile(cpus, 50), percentile(cpus, 99)
        print(f"  decoding engine's thread CPU a token in each short request's steps (its TPOT on a core of its own): "
              f"p50 {row['engine_cpu_a_token_p50_ms']:.1f} / p99 {row['engine_cpu_a_token_p99_ms']:.1f} ms", flush=True)
    for result in slowest[-args.explain:][::-1]:
        print(f"  slow request (round {result.round + 1}, arrived {result.arrival.at:.1f} s): "
              f"{span_line(result.span(), setup.steps)}")
    return {**row, "client_cpu_s": setup.client_cpu,
            **{f"decoding_steps_{name.replace(' ', '_')}": count for name, count in setup.size_counts.items()},
            **{f"{name}_{kind}_s": value for name, (engine, whole, wait) in spent.items()
               for kind, value in (("engine_cpu", engine), ("process_cpu", whole), ("engine_wait", wait))}}


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser) -> argparse.Namespace:
    parser.add_argument("--model", default="builtin", help="builtin (SmolLM2-135M, the default), random (a "
                        "random 4-layer Llama built here with SmolLM2's tokenizer) or a local HF folder or GGUF file")
    parser.add_argument("--seconds", type=float, default=45.0, help="length of one round's arrival schedule")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds (a new seed each; the setups' order alternates), pooled for the figures")
    parser.add_argument("--short-rate", type=float, default=5.0,
                        help="short requests a second (Poisson; 5: a class of 200 asking one each every 40 s; "
                             "2 before 3 Dec, which left ~1 burst in 4 with no short request decoding)")
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
    parser.add_argument("--colocated-budget", type=budgets, default=[],
                        help="also run colocated with these chunked prefill budgets, comma-separated "
                             "(--max-num-batched-tokens; the engine's default is 2048): colocated-N, to find "
                             "colocated's best")
    parser.add_argument("--disaggregated-budget", type=budgets, default=[],
                        help="also run disaggregated with these step budgets on both instances, comma-separated: "
                             "disaggregated-N (2048: the prefill instance's steps before it ran long prompts in "
                             "chunks of 512, for an A/B)")
    parser.add_argument("--bootstrap", type=int, default=2000, help="resamples for the ratios' intervals")
    parser.add_argument("--explain", type=int, default=2, help="slowest requests of each setup to break down")
    parser.add_argument("--seed", type=int, default=0, help="round n's schedule uses seed + n")
    parser.add_argument("--keep", type=Path, default=None,
                        help="a folder to keep the servers' step traces and every request's chunk times in "
                             "(requests.jsonl), to study a tail after the run")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def budgets(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of token counts: {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"budgets must be positive: {text!r}")
    return values


def setups_of(args: argparse.Namespace, serve_args: list[str]) -> list[Setup]:
    disaggregated = [*serve_args, "--disaggregated", "--kv-transport", args.kv_transport]
    setups = [Setup("colocated", serve_args)]
    setups += [Setup(f"colocated-{n}", [*serve_args, "--max-num-batched-tokens", str(n)])
               for n in args.colocated_budget]
    setups.append(Setup("disaggregated", disaggregated))
    setups += [Setup(f"disaggregated-{n}", [*disaggregated, "--max-num-batched-tokens", str(n)])
               for n in args.disaggregated_budget]
    if args.max_local_prefill_length:
        setups.append(Setup("disagg-local",
                            [*disaggregated, "--max-local-prefill-length", str(args.max_local_prefill_length)]))
    return setups


def ratio_lines(setups: list[Setup], args: argparse.Namespace) -> list[dict]:
    """Every colocated setup's TPOT p99 over every disaggregated one's, pooled, with each round's
    ratio and the block bootstrap's 90% interval, and the goal's verdict on it."""
    ratios = []
    blocks = {s.label: tpots_by_block(s.results, args.burst_every) for s in setups}
    for together in (s for s in setups if s.colocated):
        for apart in (s for s in setups if not s.colocated):
            ratio = block_bootstrap_ratio(blocks[together.label], blocks[apart.label], 99, args.bootstrap, args.seed)
            per_round = spread([percentile(a, 99) / percentile(b, 99) for n in range(args.rounds)
                                if (a := [t for (r, _), ts in blocks[together.label].items() if r == n for t in ts])
                                and (b := [t for (r, _), ts in blocks[apart.label].items() if r == n for t in ts])])
            print(f"TPOT p99 {together.label} / {apart.label}: {ratio.median:.2f}x pooled, 90% interval "
                  f"{ratio.low:.2f}-{ratio.high:.2f}x (block bootstrap), rounds {per_round.text('x', 2)}: goal >= 2 "
                  f"{verdict(ratio, 2.0)}", flush=True)
            ratios.append({"setup": f"{together.label}/{apart.label}", "tpot_p99_ratio": ratio.median,
                           "tpot_p99_ratio_low": ratio.low, "tpot_p99_ratio_high": ratio.high,
                           "tpot_p99_ratio_round_median": per_round.median})
    return ratios


def run(args: argparse.Namespace) -> dict:
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="codeyard-disagg-") as folder:
        model = {"builtin": lambda: str(builtin_model_path()),
                 "random": lambda: str(build_model(Path(folder)))}.get(args.model, lambda: args.model)()
        serve_args = ["--model", model, "--served-model-name", MODEL_NAME, "--kv-cache-memory", "1GiB",
                      "--max-num-seqs", "64", "--max-waiting", "512"]
        schedules = [workload(args, args.seed + n) for n in range(args.rounds)]
        longs = sum(a.long for a in schedules[0])
        cores = instance_cores(pin=True)
        print(f"{args.rounds} rounds of {len(schedules[0]) - longs} short requests ({args.short_tokens} tokens each; "
              f"{sum(len(s) - longs for s in schedules)} in all) and {longs} long prompts of {args.long_tokens} tokens "
              f"over {args.seconds:.0f} s; model {model}; cores: {cores}")
        setups = setups_of(args, serve_args)
        trace = args.keep / "steps" if args.keep else Path(folder) / "steps"
        os.environ[step_trace.ENV] = str(trace)  # the servers' engine loops write their steps there
        # A std::terminate at a server's exit ("terminate called without an active exception", seen
        # twice, not located) aborts it: faulthandler then prints that process's Python stacks.
        os.environ["PYTHONFAULTHANDLER"] = "1"
        both = cores[0] | cores[1] if cores else None
        with child_servers([s.serve_args for s in setups], [s.label for s in setups],
                           [both if s.colocated else None for s in setups]) as servers:
            print(f"servers up after {time.monotonic() - began:.0f} s (all loaded at once, then kept up)", flush=True)
            for setup, proc, url in zip(setups, servers.procs, servers.urls):
                setup.attach(proc.pid, url, servers.key)
            for n, arrivals in enumerate(schedules):
                for setup in setups if n % 2 == 0 else setups[::-1]:  # alternated: drift hits every setup
                    run_round(setup, arrivals, n, servers.key, trace, args)
        for name in (step_trace.ENV, "PYTHONFAULTHANDLER"):
            os.environ.pop(name, None)
    if args.keep:
        keep_requests(args.keep / "requests.jsonl", setups)
    rows = [report_setup(setup, args.rounds, args) for setup in setups]
    ratios = ratio_lines(setups, args)
    print(f"total time {time.monotonic() - began:.0f} s")
    return {"rows": rows, "ratios": ratios}


DIRECTIONS = {"tpot_p99_ms": False, "tpot_p50_ms": False, "itl_p99_ms": False, "ttft_p99_ms": False,
              "goodput_rps": True, "tpot_p99_ratio": True}


def figures(report: dict) -> dict[str, dict[str, float]]:
    return {row["setup"]: {name: row[name] for name in DIRECTIONS if name in row}
            for row in [*report["rows"], *report["ratios"]]}


if __name__ == "__main__":
    import signal

    from benchmarks.__main__ import main as bench_main

    # SIGTERM as SystemExit, so that child_servers stops the servers (the default action orphaned them)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    sys.exit(bench_main(["run", "disagg", *sys.argv[1:]]))
