"""The engine on one GPU, every figure of issue 20 in one run (under 8 minutes on one H200).

    .venv/bin/python benchmarks/gpu_check.py [--json results.json]
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/gpu_check.py --quick   # tiny shapes, the CPU

Printed, in order (each part on its own: one that fails prints its error and the run goes on):
  copy        device-to-device copy bandwidth of a 1 GiB buffer (read + write), the yardstick
  kernels     achieved bandwidth (or FLOP/s) of each Triton kernel: decode attention at batch 64 x
              2k context (goal: >= 70% of the copy bandwidth), the KV-cache write, the fused
              RMSNorm (+ residual), rotary and SiLU x up, the int4/int8/fp8 GEMMs (a decode-sized
              M: weight bandwidth; a prefill-sized M: FLOP/s) next to torch's bf16 matmul, and the
              sampler's penalties over a batch of logits
  parity      greedy tokens of random-weight small Llama models vs Transformers on the same
              device: float32 and bfloat16, CUDA graphs on and off, a batch with a shared prefix
  throughput  a random-weight Llama-3-8B-shaped model in bf16 (config built here, weights drawn on
              the GPU: nothing downloaded): output tokens/s of the engine on a batch of requests
              vs Transformers one request at a time and in padded batches (goals: >= 10x, >= 2x)
  tpot        single-stream time per output token with CUDA graphs and with enforce_eager
              (goal: >= 30% lower with graphs)
Without a CUDA device the full run prints one line saying so and exits 0. `--quick` runs the same
code on tiny shapes (the CPU when there is no GPU, Triton kernels in the interpreter), which a CPU
test runs to keep the script's plumbing working. `--json PATH` writes every figure and error.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._baselines import run_hf_batched, run_hf_single  # noqa: E402
from benchmarks._workload import BenchRequest, RequestTiming  # noqa: E402
from llm_engine.kernels.autotune import time_launches  # noqa: E402  (no Triton: torch only)

GIB = 1024**3


@dataclass
class Shapes:
    """Everything that differs between the full run and --quick."""

    copy_bytes: int
    decode: tuple[int, int, int, int, int, int]  # batch, context, heads, kv heads, head_dim, block size
    tokens: int  # rows for the fused kernels and the prefill-sized GEMM
    hidden: int
    intermediate: int
    decode_rows: int  # the decode-sized GEMM's M
    repeats: int
    big_model: dict[str, int]  # the throughput model's config
    requests: int  # engine throughput batch
    hf_single: int  # requests Transformers runs one at a time
    hf_batch: int  # its padded batch size
    input_len: int
    output_len: int
    tpot_tokens: int
    max_num_seqs: int
    parity_prompts: int
    parity_tokens: int
    parity_dtypes: tuple[str, ...]


FULL = Shapes(copy_bytes=GIB, decode=(64, 2048, 32, 8, 128, 16), tokens=4096, hidden=4096, intermediate=14336,
              decode_rows=16, repeats=20,
              big_model=dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192),
              requests=256, hf_single=3, hf_batch=32, input_len=128, output_len=128, tpot_tokens=128,
              max_num_seqs=256, parity_prompts=6, parity_tokens=12, parity_dtypes=("float32", "bfloat16"))
QUICK = Shapes(copy_bytes=4 * 1024**2, decode=(2, 40, 4, 2, 16, 4), tokens=8, hidden=64, intermediate=96,
               decode_rows=2, repeats=1,
               big_model=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, vocab_size=320, max_position_embeddings=256),
               requests=2, hf_single=1, hf_batch=2, input_len=8, output_len=2, tpot_tokens=3, max_num_seqs=4,
               parity_prompts=2, parity_tokens=3, parity_dtypes=("float32",))


@dataclass
class Report:
    device: str
    quick: bool
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def figure(self, name: str, value: float, unit: str, goal: str | None = None, met: bool | None = None) -> None:
        self.figures[name] = {"value": value, "unit": unit, "goal": goal, "met": met}
        verdict = "" if met is None else ("  [goal met]" if met else "  [goal NOT met]")
        print(f"  {name:<44} {value:>12.4g} {unit}{f'  (goal: {goal})' if goal else ''}{verdict}", flush=True)

    def part(self, name: str, run: Callable[[], None]) -> None:
        print(f"{name}:", flush=True)
        started = time.perf_counter()
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - one part failing must not hide the others' figures
            self.errors[name] = f"{type(exc).__name__}: {exc}"
            print(f"  FAILED: {self.errors[name]}", flush=True)
            traceback.print_exc(limit=4)
        print(f"  ({time.perf_counter() - started:.1f} s)", flush=True)
        if torch.cuda.is_available():  # the part's models and pools, before the next one takes its share
            gc.collect()
            torch.cuda.empty_cache()


# ---- copy bandwidth and kernels ------------------------------------------------------------------------

def copy_bandwidth(report: Report, device: torch.device, shapes: Shapes) -> float:
    src = torch.empty(shapes.copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = time_launches(lambda: dst.copy_(src), device, shapes.repeats)
    bandwidth = 2 * shapes.copy_bytes / seconds / 1e9  # each byte read once and written once
    report.figure("device copy bandwidth", bandwidth, "GB/s")
    return bandwidth


def kernel_figures(report: Report, device: torch.device, shapes: Shapes, copy_gbs: float) -> None:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for name, run in (("decode attention", decode_attention), ("kv-cache write", kv_cache_write),
                      ("fused layers", fused_layers), ("quantized GEMMs", quantized_gemms),
                      ("sampling penalties", sampling_penalties)):
        try:
            run(report, device, shapes, dtype, copy_gbs)
        except Exception as exc:  # noqa: BLE001 - a kernel that fails is reported, the others still run
            report.errors[f"kernels/{name}"] = f"{type(exc).__name__}: {exc}"
            print(f"  {name}: FAILED: {type(exc).__name__}: {exc}", flush=True)


def decode_attention(report: Report, device: torch.device, shapes: Shapes, dtype: torch.dtype,
                     copy_gbs: float) -> None:
    from llm_engine.kernels.attention import paged_decode

    batch, context, heads, kv_heads, dim, block = shapes.decode
    blocks_per_seq = -(-context // block)
    k_cache = torch.randn(batch * blocks_per_seq, kv_heads, block, dim, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(batch * blocks_per_seq, device=device).view(batch, blocks_per_seq).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, heads, dim, dtype=dtype, device=device)
    seconds = time_launches(lambda: paged_decode(q, k_cache, v_cache, tables, lens, dim**-0.5), device,
                            shapes.repeats)
    moved = 2 * batch * context * kv_heads * dim * k_cache.element_size() + 2 * q.numel() * q.element_size()
    gbs = moved / seconds / 1e9
    report.figure(f"decode attention {batch}x{context} bandwidth", gbs, "GB/s")
    report.figure("decode attention / copy bandwidth", gbs / copy_gbs, "x", ">= 0.70", gbs / copy_gbs >= 0.70)


def kv_cache_write(report: Report, device: torch.device, shapes: Shapes, dtype: torch.dtype, copy_gbs: float) -> None:
    from llm_engine.kernels.kv_cache import reshape_and_cache

    _, _, _, kv_heads, dim, block = shapes.decode
    tokens = shapes.tokens
    k = torch.randn(tokens, kv_heads, dim, dtype=dtype, device=device)
    v = torch.randn_like(k)
    k_cache = torch.zeros(-(-tokens // block) + 1, kv_heads, block, dim, dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(tokens, device=device)
    seconds = time_launches(lambda: reshape_and_cache(k, v, k_cache, v_cache, slots), device, shapes.repeats)
    report.figure(f"kv-cache write ({tokens} tokens) bandwidth", 4 * k.numel() * k.element_size() / seconds / 1e9,
                  "GB/s")


def sampling_penalties(report: Report, device: torch.device, shapes: Shapes, dtype: torch.dtype,
                       copy_gbs: float) -> None:
    from llm_engine.kernels.sampling import apply_penalties

    rows, vocab = shapes.max_num_seqs, shapes.big_model["vocab_size"]
    logits = torch.randn(rows, vocab, device=device)
    counts = torch.randint(0, 3, (rows, vocab), dtype=torch.int32, device=device)
    prompt = torch.randint(0, 2, (rows, vocab), dtype=torch.uint8, device=device)
    repetition, zero = torch.full((rows,), 1.1, device=device), torch.zeros(rows, device=device)
    seconds = time_launches(lambda: apply_penalties(logits, counts, prompt, repetition, zero, zero), device,
                            shapes.repeats)
    report.figure(f"sampling penalties {rows}x{vocab} bandwidth", rows * vocab * (4 + 4 + 4 + 1) / seconds / 1e9,
                  "GB/s")


def fused_layers(report: Report, device: torch.device, shapes: Shapes, dtype: torch.dtype, copy_gbs: float) -> None:
    from llm_engine.kernels import fused

    tokens, hidden, inter = shapes.tokens, shapes.hidden, shapes.intermediate
    x = torch.randn(tokens, hidden, dtype=dtype, device=device)
    residual = torch.randn_like(x)
    weight = torch.randn(hidden, dtype=dtype, device=device)
    size = x.element_size()

    def gbs(moved: int, seconds: float) -> float:
        return moved / seconds / 1e9

    seconds = time_launches(lambda: fused.rms_norm(x, weight, 1e-6), device, shapes.repeats)
    report.figure("rms_norm bandwidth", gbs(2 * x.numel() * size, seconds), "GB/s")
    seconds = time_launches(lambda: fused.fused_add_rms_norm(x, residual, weight, 1e-6), device, shapes.repeats)
    report.figure("fused_add_rms_norm bandwidth", gbs(4 * x.numel() * size, seconds), "GB/s")
    gate_up = torch.randn(tokens, 2 * inter, dtype=dtype, device=device)
    seconds = time_launches(lambda: fused.silu_and_mul(gate_up), device, shapes.repeats)
    report.figure("silu_and_mul bandwidth", gbs(3 * tokens * inter * size, seconds), "GB/s")
    _, _, heads, kv_heads, dim, _ = shapes.decode
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype, device=device)
    q = qkv[:, :heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    angles = torch.randn(tokens, dim // 2, device=device)
    cos, sin = angles.cos(), angles.sin()
    positions = torch.arange(tokens, device=device)
    seconds = time_launches(lambda: fused.rotary_embedding(positions, q, k, cos, sin), device, shapes.repeats)
    report.figure("rotary (in place on fused qkv) bandwidth", gbs(2 * (heads + kv_heads) * dim * tokens * size,
                                                                    seconds), "GB/s")


def quantized_gemms(report: Report, device: torch.device, shapes: Shapes, dtype: torch.dtype,
                    copy_gbs: float) -> None:
    from llm_engine.kernels import quant_gemm
    from llm_engine.layers.quantization import pack_int4, quantize_fp8, quantize_int4, quantize_int8

    n, k_in = shapes.intermediate, shapes.hidden
    w = torch.randn(n, k_in, device=device) * 0.02
    group = min(128, k_in)
    codes, scales4, offsets4 = quantize_int4(w, group, symmetric=False)
    q8, scales8 = quantize_int8(w, k_in)
    f8, scales_f8 = quantize_fp8(w, k_in, per_tensor=False)
    dense = w.to(dtype)
    packed4 = pack_int4(codes, group)
    cases: list[tuple[str, Callable[[torch.Tensor], torch.Tensor], int]] = [
        (f"int4 g{group}", lambda x: quant_gemm.int4_gemm(x, packed4, scales4, offsets4, group), n * k_in // 2),
        ("int8", lambda x: quant_gemm.int8_gemm(x, q8, scales8, k_in), n * k_in),
        ("fp8", lambda x: quant_gemm.fp8_gemm(x, f8, scales_f8, k_in), n * k_in),
        ("bf16 torch matmul" if dtype == torch.bfloat16 else "float32 torch matmul",
         lambda x: x @ dense.t(), n * k_in * dense.element_size()),
    ]
    for rows, what in ((shapes.decode_rows, "decode"), (shapes.tokens, "prefill")):
        x = torch.randn(rows, k_in, dtype=dtype, device=device)
        for name, gemm, weight_bytes in cases:
            try:
                seconds = time_launches(lambda gemm=gemm: gemm(x), device, shapes.repeats)
            except Exception as exc:  # noqa: BLE001 - e.g. fp8 on a device without it
                report.errors[f"kernels/{name} {what}"] = f"{type(exc).__name__}: {exc}"
                print(f"  {name} M={rows}: FAILED: {type(exc).__name__}: {exc}", flush=True)
                continue
            if what == "decode":
                report.figure(f"{name} GEMM M={rows} weight bandwidth", weight_bytes / seconds / 1e9, "GB/s")
            else:
                report.figure(f"{name} GEMM M={rows}", 2 * rows * n * k_in / seconds / 1e12, "TFLOP/s")


# ---- models ---------------------------------------------------------------------------------------------

def random_llama(folder: Path, device: torch.device, dtype: torch.dtype, seed: int, **shape: int) -> Any:
    """A random-weight Llama drawn on `device` (nothing downloaded), also saved under `folder` for the engine."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**shape, rope_theta=500000.0, initializer_range=0.02, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0, tie_word_embeddings=False)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder)
    return model.eval()


def engine(path: Path, device: torch.device, dtype: str, **options: Any) -> Any:
    from llm_engine import LLM

    extra = {"attention_backend": "torch", "kv_cache_memory": "64MiB"} if device.type == "cpu" else {}
    return LLM(model=str(path), dtype=dtype, device=str(device), **extra, **options)


def greedy(max_tokens: int) -> Any:
    from llm_engine import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def hf_greedy(model: Any, prompts: list[list[int]], new_tokens: int, device: torch.device) -> list[list[int]]:
    """Transformers' greedy tokens, one unpadded prompt at a time."""
    out = []
    for prompt in prompts:
        with torch.no_grad():
            ids = model.generate(torch.tensor([prompt], device=device), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        out.append(ids[0, len(prompt):].tolist())
    return out


def parity(report: Report, device: torch.device, shapes: Shapes, folder: Path) -> None:
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=320, max_position_embeddings=512)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 320) for _ in range(rng.randint(4, 40))] for _ in range(shapes.parity_prompts)]
    prompts.append(prompts[0][:32] + [7, 8, 9])  # shares prefix blocks with the first prompt
    new_tokens = shapes.parity_tokens
    graphs = (False, True) if device.type == "cuda" else (True,)  # no graphs on the CPU
    modes = [(dtype, eager) for dtype in shapes.parity_dtypes for eager in graphs]
    path = folder / "small"
    model = random_llama(path, torch.device("cpu"), torch.float32, seed=1234, **small)
    for dtype, eager in modes:
        hf = model.to(getattr(torch, dtype)).to(device)
        expected = hf_greedy(hf, prompts, new_tokens, device)
        llm = engine(path, device, dtype, enforce_eager=eager, block_size=16, max_num_seqs=8, num_kv_blocks=64)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(new_tokens), use_tqdm=False)]
        del llm
        same = sum(a == b for a, b in zip(got, expected))
        prefix = sum(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(got, expected))
        label = f"parity {dtype} {'eager' if eager else 'graphs'}"
        exact_goal = dtype == "float32"
        report.figure(f"{label}: identical sequences", same, f"of {len(prompts)}",
                      "all" if exact_goal else None, same == len(prompts) if exact_goal else None)
        report.figure(f"{label}: tokens before first difference", prefix / len(prompts),
                      f"of {new_tokens} (mean)")


def random_prompts(count: int, low: int, high: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(low, high))] for _ in range(count)]


def throughput_and_tpot(report: Report, device: torch.device, shapes: Shapes, folder: Path) -> None:
    """Transformers first (its model freed before the engine takes its share of the GPU)."""
    vocab = shapes.big_model["vocab_size"]
    path = folder / "big"
    hf = random_llama(path, device, torch.bfloat16, seed=0, **shapes.big_model)
    prompts = random_prompts(shapes.requests, shapes.input_len // 2, shapes.input_len, vocab, seed=1)
    out_len = shapes.output_len
    dtype = "bfloat16"
    requests = [BenchRequest(prompt, out_len) for prompt in prompts]
    run_hf_single(hf, [BenchRequest(prompts[0], 2)], lambda *_: None, device)  # warm-up
    hf_single = tokens_per_s(run_hf_single(hf, requests[:shapes.hf_single], lambda *_: None, device))
    report.figure("Transformers one request at a time", hf_single, "output tok/s")
    hf_batched = tokens_per_s(run_hf_batched(hf, requests[:2 * shapes.hf_batch], shapes.hf_batch, lambda *_: None,
                                             device))
    report.figure(f"Transformers padded batches of {shapes.hf_batch}", hf_batched, "output tok/s")
    del hf
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

    options = dict(max_num_seqs=shapes.max_num_seqs, max_model_len=shapes.input_len + max(out_len, shapes.tpot_tokens)
                   + 16, gpu_memory_utilization=0.85)
    llm = engine(path, device, dtype, **options)
    llm.generate(prompts[:2], greedy(2), use_tqdm=False)  # warm-up
    started = time.perf_counter()
    outputs = llm.generate(prompts, greedy(out_len), use_tqdm=False)
    ours = sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - started)
    report.figure(f"engine, {shapes.requests} requests", ours, "output tok/s")
    report.figure("engine / Transformers one at a time", ours / hf_single, "x", ">= 10", ours / hf_single >= 10)
    report.figure("engine / Transformers padded batches", ours / hf_batched, "x", ">= 2", ours / hf_batched >= 2)
    with_graphs = tpot(llm, prompts[0], shapes.tpot_tokens)
    del llm, outputs
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    options.update(num_kv_blocks=64)  # one stream: a small pool, whatever the first engine left behind
    llm = engine(path, device, dtype, enforce_eager=True, **options)
    eager = tpot(llm, prompts[0], shapes.tpot_tokens)
    del llm
    report.figure("single-stream TPOT with CUDA graphs", with_graphs * 1e3, "ms")
    report.figure("single-stream TPOT eager", eager * 1e3, "ms")
    lower = 1 - with_graphs / eager
    report.figure("TPOT lower with graphs by", lower * 100, "%", ">= 30%",
                  lower >= 0.30 if device.type == "cuda" else None)


def tokens_per_s(run: tuple[list[RequestTiming], float]) -> float:
    """Output tokens/s of a Transformers baseline run (benchmarks/_baselines.py: timings, wall time)."""
    timings, seconds = run
    return sum(t.num_tokens for t in timings) / seconds


def tpot(llm: Any, prompt: list[int], tokens: int) -> float:
    """Seconds per output token after the first: (time for `tokens` - time for 1) / (tokens - 1)."""
    llm.generate([prompt], greedy(2), use_tqdm=False)  # warm-up

    def timed(n: int) -> float:
        started = time.perf_counter()
        llm.generate([prompt], greedy(n), use_tqdm=False)
        return time.perf_counter() - started

    first = min(timed(1) for _ in range(3))
    return (timed(tokens) - first) / (tokens - 1)


# ---- the command line -----------------------------------------------------------------------------------

def scratch_parent(shapes: Shapes) -> str | None:
    """/dev/shm when it holds the big model's checkpoint twice over (saving 16 GB to a disk is slow), else
    the default temporary folder."""
    model = shapes.big_model
    params = model["num_hidden_layers"] * (4 * model["hidden_size"] ** 2 + 3 * model["hidden_size"]
                                           * model["intermediate_size"]) + 2 * model["vocab_size"] * model["hidden_size"]
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return None
    return "/dev/shm" if stats.f_bavail * stats.f_frsize > 4 * params else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes; the CPU (Triton interpreted) without a GPU")
    parser.add_argument("--json", type=Path, help="write every figure and error to this file")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        print(f"gpu_check: no CUDA device (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}); "
              f"nothing measured. --quick runs the plumbing on the CPU.")
        return 0
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        print("gpu_check: --quick on the CPU needs TRITON_INTERPRET=1 set before Python starts (Triton reads it "
              "when the kernels are defined)", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name(device) if cuda else "cpu (Triton interpreter)"
    report = Report(name, args.quick)
    shapes = QUICK if args.quick else FULL
    print(f"gpu_check on {name}{' --quick' if args.quick else ''}: torch {torch.__version__}", flush=True)
    started = time.perf_counter()
    copy_gbs: list[float] = []

    def copy() -> None:
        copy_gbs.append(copy_bandwidth(report, device, shapes))

    with tempfile.TemporaryDirectory(prefix="gpu-check-", dir=scratch_parent(shapes)) as scratch:
        folder = Path(scratch)
        report.part("copy", copy)
        report.part("kernels", lambda: kernel_figures(report, device, shapes, copy_gbs[0] if copy_gbs else float("nan")))
        report.part("parity", lambda: parity(report, device, shapes, folder))
        report.part("throughput and tpot", lambda: throughput_and_tpot(report, device, shapes, folder))
    total = time.perf_counter() - started
    print(f"gpu_check: {len(report.figures)} figures, {len(report.errors)} errors, {total:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": report.device, "quick": report.quick, "seconds": total,
                                         "figures": report.figures, "errors": report.errors}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
