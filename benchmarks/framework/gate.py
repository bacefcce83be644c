"""The CI regression gate: the engine's key figures as ratios against Transformers on the same
inputs, measured in the same run, compared with a baseline kept in the repository.

A slower or busier machine slows both systems, so their ratio stays; a change that slows the
engine moves it. Each repeat times, back to back and best of ROUNDS, the engine (`LLM.generate`, all prompts at
once) and Transformers (`generate`, the same prompts as one left-padded batch) on a small seeded
random Llama with SmolLM2's tokenizer, built on the spot. Figures: output-throughput ratio
(engine / Transformers, higher is better) and TTFT ratio (engine mean time to first token /
Transformers' prefill of the batch, lower is better), judged by results.compare's rank test.
Accuracy is checked outright: greedy outputs must agree with Transformers and the perplexity of
a fixed local text (the Zen of Python) must match it within 1%.

The speed verdict comes from a same-run A/B (gate_ab.py) where it can: the baseline file's commit's
engine against this tree's, alternating. The stored ratios are printed beside it and decide only
where that commit is not in the clone: on a shared cloud host they drift more than the 20% slowdown
the gate must catch.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import math
import random
import tempfile
import time
from pathlib import Path

from benchmarks.framework import gate_ab, results
from benchmarks.framework.workloads import Corpus

NUM_PROMPTS, OUTPUT_LEN, INPUT_LEN = 8, 16, (32, 128)
ROUNDS = 3  # per repeat, alternating; each system's best round counts (interference only adds time)


def build_model(folder: Path):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from benchmarks.__main__ import load_tokenizer
    from llm_engine.entrypoints.models import builtin_model_path

    tokenizer = load_tokenizer(str(builtin_model_path()))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         initializer_range=0.05, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return tokenizer


def zen() -> str:
    """The Zen of Python: a fixed text every Python has (`this.s`, rot13; importing prints it)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13")


def open_engine(folder: Path):
    """The engine as the gate times it: float32, one thread, all prompts in one batch."""
    from llm_engine import LLM

    return LLM(str(folder), max_num_seqs=NUM_PROMPTS, dtype="float32", max_model_len=1024, num_threads=1)


def engine_round(llm, prompts: list[list[int]]) -> tuple[float, float, list[list[int]]]:
    """One timed `generate` of all prompts: (output tokens/s, mean TTFT s, outputs)."""
    from llm_engine import SamplingParams

    params = SamplingParams(max_tokens=OUTPUT_LEN, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate([list(p) for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    ttft = sum(o.metrics.first_token_time - o.metrics.arrival_time for o in outs) / len(outs)
    return len(prompts) * OUTPUT_LEN / elapsed, ttft, [list(o.outputs[0].token_ids) for o in outs]


class Pair:
    """The engine and Transformers over one model folder, timed on the same prompts."""

    def __init__(self, folder: Path, tokenizer, prompts: list[list[int]]) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)  # one thread each: a busy machine delays them, never oversubscribes them
        self.torch = torch
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.llm = open_engine(folder)
        self.hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        width = max(len(p) for p in prompts)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        self.attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        self.pad = pad

    def engine(self) -> tuple[float, float, list[list[int]]]:
        return engine_round(self.llm, self.prompts)

    def transformers(self) -> tuple[float, float, list[list[int]]]:
        """(output tokens/s, prefill seconds of the batch, outputs)."""
        torch = self.torch
        with torch.inference_mode():
            start = time.perf_counter()
            self.hf(input_ids=self.input_ids, attention_mask=self.attention)
            prefill = time.perf_counter() - start
            start = time.perf_counter()
            out = self.hf.generate(input_ids=self.input_ids, attention_mask=self.attention, do_sample=False,
                                   max_new_tokens=OUTPUT_LEN, min_new_tokens=OUTPUT_LEN, pad_token_id=self.pad)
            elapsed = time.perf_counter() - start
        return NUM_PROMPTS * OUTPUT_LEN / elapsed, prefill, out[:, self.input_ids.shape[1]:].tolist()

    def perplexities(self, text: str) -> tuple[float, float]:
        """(engine, Transformers) perplexity of `text`, from prompt logprobs and from the loss."""
        from llm_engine import SamplingParams

        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        out = self.llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
        logprobs = [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], ids[1:])]
        engine = math.exp(-sum(logprobs) / len(logprobs))
        with self.torch.inference_mode():
            loss = self.hf(input_ids=self.torch.tensor([ids]), labels=self.torch.tensor([ids])).loss.item()
        return engine, math.exp(loss)


def measure(repeats: int, slowdown: float, ab_commit: str | None = None, log=print) -> dict:
    """The ratios against Transformers, accuracy, and with `ab_commit` the same-run A/B against that
    commit's engine (or why it could not run, under "ab_unavailable")."""
    from benchmarks.framework.targets import inject_slowdown

    result = results.new_result("gate", "engine-vs-transformers", {
        "num_prompts": NUM_PROMPTS, "output_len": OUTPUT_LEN, "input_len": INPUT_LEN, "repeats": repeats,
        "inject_slowdown": slowdown})
    with tempfile.TemporaryDirectory(prefix="codeyard-gate-") as tmp:
        tokenizer = build_model(Path(tmp))
        corpus, rng = Corpus(tokenizer), random.Random(0)
        prompts = [tokenizer(corpus.text(rng, rng.randint(*INPUT_LEN)), add_special_tokens=False).input_ids
                   for _ in range(NUM_PROMPTS)]
        pair = Pair(Path(tmp), tokenizer, prompts)
        if slowdown:
            inject_slowdown(slowdown)
        pair.engine(), pair.transformers()  # warm-up
        for repeat in range(repeats):
            rounds = [(pair.engine(), pair.transformers()) for _ in range(ROUNDS)]
            e_tps, e_ttft, e_out = max((r[0] for r in rounds), key=lambda e: e[0])
            h_tps, h_prefill, h_out = max((r[1] for r in rounds), key=lambda h: h[0])
            e_ttft = min(r[0][1] for r in rounds)
            h_prefill = min(r[1][1] for r in rounds)
            figures = {"throughput_ratio": round(e_tps / h_tps, 4), "ttft_ratio": round(e_ttft / h_prefill, 4),
                       "engine_tok_s": round(e_tps, 1), "hf_tok_s": round(h_tps, 1)}
            results.add_repeat(result, "engine / transformers", figures)
            log(f"repeat {repeat + 1}: engine {e_tps:7.1f} tok/s, Transformers {h_tps:7.1f} tok/s -> "
                f"ratio {figures['throughput_ratio']:.3f}; TTFT ratio {figures['ttft_ratio']:.3f}")
        if ab_commit:
            try:
                gate_ab.measure(result, ab_commit, Path(tmp), prompts, repeats, ROUNDS, slowdown, log)
            except gate_ab.ABUnavailable as exc:
                result["ab_unavailable"] = str(exc)
        agree = sum(a == b for a, b in zip(e_out, h_out)) / len(prompts)
        ppl_engine, ppl_hf = pair.perplexities(zen())
        result["accuracy"] = {"greedy_agreement": agree, "perplexity": round(ppl_engine, 4),
                              "reference_perplexity": round(ppl_hf, 4)}
        log(f"outputs: greedy agreement {agree:.2f}, perplexity {ppl_engine:.3f} vs Transformers {ppl_hf:.3f}")
    return result


def accuracy_problems(result: dict, baseline: dict | None) -> list[str]:
    acc = result["accuracy"]
    problems = []
    if abs(acc["perplexity"] / acc["reference_perplexity"] - 1) > 0.01:
        problems.append(f"perplexity {acc['perplexity']} is not within 1% of Transformers' "
                        f"{acc['reference_perplexity']}")
    floor = baseline["accuracy"]["greedy_agreement"] - 0.125 if baseline else 0.75
    if acc["greedy_agreement"] < floor:
        problems.append(f"greedy agreement with Transformers {acc['greedy_agreement']:.2f} < {floor:.2f}")
    return problems


BASELINES = Path(__file__).resolve().parents[1] / "baselines"


def cpu_kind() -> str:
    """"avx512_bf16" where the CPU multiplies bf16 natively (AVX512-BF16 or AMX), else "avx2". The
    ratios move with it: on such a CPU Transformers' float32 prefill gains more than the engine's
    (last stop's code: TTFT ratio 0.063 on an AVX2 machine, 0.112 on an AVX512-BF16/AMX one)."""
    from llm_engine.model_runner import cpu_has_fast_bf16

    return "avx512_bf16" if cpu_has_fast_bf16() else "avx2"


def default_baseline() -> Path:
    """The stored baseline for this CPU kind, else gate.json (measured on an AVX2 machine)."""
    kind = BASELINES / f"gate-{cpu_kind()}.json"
    return kind if kind.exists() else BASELINES / "gate.json"


def main(args) -> int:
    baseline_path = Path(args.baseline) if args.baseline else default_baseline()
    baseline = results.load(baseline_path) if baseline_path.exists() and not args.update_baseline else None
    result = measure(args.repeats, args.inject_slowdown, baseline["git"]["commit"] if baseline else None)
    if args.out:
        results.save(result, args.out)
    print(f"baseline: {baseline_path.name} (this CPU: {cpu_kind()})")
    if args.update_baseline:
        results.save(result, baseline_path)
        print(f"wrote the baseline {baseline_path}")
        return 0
    problems = accuracy_problems(result, baseline)
    regressions = []
    if baseline is None:
        print(f"no baseline at {baseline_path}; write one with --update-baseline")
    else:
        stored = results.compare(baseline, result, ["throughput_ratio", "ttft_ratio"], min_change=args.min_change)
        print(results.table(stored, baseline, result))
        if "ab_unavailable" in result:
            print(f"no same-run A/B ({result['ab_unavailable']}): the stored ratios decide")
            regressions = [v for v in stored if v.status == "regression"]
        else:
            same_run = gate_ab.verdicts(result, alpha=0.05, min_change=args.min_change)
            print("same-run A/B against the baseline commit's engine (decides):")
            print("\n".join(results.table(same_run, baseline, result).splitlines()[1:]))
            regressions = [v for v in same_run if v.status == "regression"]
    for problem in problems:
        print("accuracy:", problem)
    print("gate:", "FAILED" if regressions or problems else "passed")
    return 1 if regressions or problems else 0
