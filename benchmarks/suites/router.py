"""Router benchmark (issue 19): prefix-cache hit rate of data-parallel replicas on a
shared-preamble workload (a class's students asking about a few exercises, each exercise's
instructions a long common preamble), for one replica, two behind the cache-aware router, and two
behind round-robin; each replica's KV pool is the same size. Goal: two cache-aware replicas keep
at least 90% of one replica's hit rate; round-robin is the baseline they should beat.

    python -m benchmarks run router                       # built-in SmolLM2
    python -m benchmarks run router --preambles 8 --rounds 4 --kv-cache-memory 64MiB

Replicas are real `codeyard llm serve` processes (the --data-parallel-size launcher's); the
router runs in this process over httpx's ASGI transport. Hit rates come from each replica's
`vllm:prefix_cache_hits/queries` counters.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llm_engine.entrypoints.models import resolve_model
from llm_engine.entrypoints.replicas import replica_servers
from llm_engine.entrypoints.router import create_router_app

TOPICS = ["loops", "recursion", "dictionaries", "file handling", "classes", "exceptions", "list comprehensions",
          "string formatting", "sorting", "generators", "closures", "unit tests"]


def workload(num_preambles: int, rounds: int, seed: int) -> list[str]:
    """rounds x preambles prompts, a round visiting every exercise in a shuffled order."""
    rng = random.Random(seed)
    preambles = [f"You are the teaching assistant for the exercise on {TOPICS[i % len(TOPICS)]} (part {i}). "
                 + " ".join(f"Rule {j}: explain {TOPICS[(i + j) % len(TOPICS)]} step by step, with a short "
                            f"example the student can run, and never give the full solution." for j in range(8))
                 for i in range(num_preambles)]
    prompts = []
    for r in range(rounds):
        order = list(range(num_preambles))
        rng.shuffle(order)
        prompts += [preambles[i] + f"\nStudent {r}: why does my code for part {i} fail?" for i in order]
    return prompts


def prefix_counters(url: str, key: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30).text
    values = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    return values.get("vllm:prefix_cache_hits_total", 0.0), values.get("vllm:prefix_cache_queries_total", 0.0)


async def send_all(app, prompts: list[str], model: str) -> float:
    started = time.perf_counter()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://router", timeout=600) as client:
        for prompt in prompts:
            answer = await client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1})
            answer.raise_for_status()
    return time.perf_counter() - started


def run_setup(label: str, serve_args: list[str], replicas: int, policy: str, prompts: list[str], model: str) -> dict:
    with replica_servers(serve_args, replicas) as (urls, key):
        app = create_router_app(urls, replica_key=key, policy=policy)
        seconds = asyncio.run(send_all(app, prompts, model))
        counters = [prefix_counters(url, key) for url in urls]
    hits, queries = sum(h for h, _ in counters), sum(q for _, q in counters)
    row = {"setup": label, "replicas": replicas, "policy": policy, "hit_rate": hits / queries if queries else 0.0,
           "hit_tokens": hits, "prompt_tokens": queries, "seconds": seconds}
    print(f"{label:<28} hit rate {row['hit_rate']:6.1%}  ({hits:.0f} of {queries:.0f} prompt tokens)  "
          f"{seconds:6.1f} s", flush=True)
    return row


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser) -> argparse.Namespace:
    parser.add_argument("--model", help="local HF folder or .gguf (default: the built-in SmolLM2)")
    parser.add_argument("--preambles", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--kv-cache-memory", default="64MiB", help="each replica's KV pool")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    path, name = resolve_model(args.model)
    serve_args = ["--model", path, "--served-model-name", name, "--kv-cache-memory", args.kv_cache_memory,
                  "--max-num-seqs", "8"]
    prompts = workload(args.preambles, args.rounds, args.seed)
    print(f"{len(prompts)} requests, {args.preambles} preambles, KV pool {args.kv_cache_memory} per replica")
    rows = [run_setup("1 replica", serve_args, 1, "prefix", prompts, name),
            run_setup("2 replicas, cache-aware", serve_args, 2, "prefix", prompts, name),
            run_setup("2 replicas, round-robin", serve_args, 2, "round_robin", prompts, name)]
    single, aware, rr = (row["hit_rate"] for row in rows)
    print(f"cache-aware / 1 replica: {aware / single:.2f} (goal >= 0.90); "
          f"round-robin / 1 replica: {rr / single:.2f}; cache-aware / round-robin: {aware / rr:.2f}")
    return {"rows": rows}


DIRECTIONS = {"hit_rate": True}


def figures(report: dict) -> dict[str, dict[str, float]]:
    return {row["setup"]: {"hit_rate": row["hit_rate"], "seconds": row["seconds"]} for row in report["rows"]}
