"""`python -m benchmarks` (or `codeyard bench`): the benchmark framework's command line, run from the
repository root.

    python -m benchmarks list
    python -m benchmarks run throughput --single-stream --out results/single.json   # a self-timed suite
    python -m benchmarks run poisson --targets offline,v1,v2,grpc --repeats 3 --out results/x.json
    python -m benchmarks run grid --set batch=1,8 --set input_len=64 --url http://host:8001 --targets v1,v2
    python -m benchmarks compare baseline.json current.json          # exit 1 on a regression
    python -m benchmarks paired results/x.json --loaded-wait-ms 20   # judge a stored run's overhead again
    python -m benchmarks gate                                         # the CI check (ratios vs Transformers)
    python -m benchmarks report results/*.json --out report.html      # PNG + self-contained HTML
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import os
import sys
from importlib import import_module
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.suites import SUITES  # noqa: E402

TARGETS = ("offline", "v1", "v2", "grpc")


class UsageError(Exception):
    """Bad input on the command line: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints the usage too and exits; one line is enough
        raise UsageError(message)


def _value(text: str):
    """A --set value: numbers and comma lists of numbers become tuples/numbers."""
    parts = [p for p in text.split(",") if p]
    try:
        numbers = [int(p) if p.lstrip("-").isdigit() else float(p) for p in parts]
    except ValueError:
        return text
    return tuple(numbers) if "," in text else numbers[0]


def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    from llm_engine.loader.gguf_conversion import config_and_tokenizer

    path = Path(model_path)
    if path.is_file():
        return config_and_tokenizer(path)[1]  # converted once, then read from the cache
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def cmd_run(args) -> int:
    from benchmarks.framework import paired, results, runner
    from benchmarks.framework.targets import Server
    from benchmarks.framework.workloads import WORKLOADS, Corpus
    from llm_engine.entrypoints.models import resolve_model

    build = WORKLOADS.get(args.workload)
    if build is None:
        raise UsageError(f"unknown workload {args.workload!r}; choose from {', '.join([*WORKLOADS, *SUITES])}")
    if any("=" not in s for s in args.set):
        raise UsageError("--set takes KEY=VALUE")
    settings = {k: _value(v) for k, v in (s.split("=", 1) for s in args.set)}
    unknown = sorted(set(settings) - set(inspect.signature(build).parameters) - {"corpus", "seed"})
    if unknown:
        raise UsageError(f"workload {args.workload} has no setting {', '.join(unknown)}")
    kinds = args.targets.split(",")
    if not kinds or set(kinds) - set(TARGETS):
        raise UsageError(f"--targets: choose from {','.join(TARGETS)}")
    if args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    if args.probe_interval < 0:
        raise UsageError("--probe-interval must be 0 (off) or more seconds")
    engine_cpus, client_cpus = _cpus(args.engine_cpus, "--engine-cpus"), _cpus(args.client_cpus, "--client-cpus")
    if bool(engine_cpus) != bool(client_cpus) or (engine_cpus and engine_cpus & client_cpus):
        raise UsageError("--engine-cpus and --client-cpus go together and must not overlap")
    api_cpus = _api_cpus(args.api_cpus, client_cpus)
    model_path, _ = resolve_model(args.model)
    workload = build(Corpus(load_tokenizer(model_path)), args.seed, **settings)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    server = None
    if any(k != "offline" for k in kinds):
        server = Server(model_path, args.max_num_seqs, url=args.url, grpc=args.grpc, api_key=args.api_key,
                        engine_cpus=engine_cpus, other_cpus=api_cpus, engine=args.server_engine)
    offline = {"model": model_path, "max_num_seqs": args.max_num_seqs, "slowdown": args.inject_slowdown,
               "cpus": engine_cpus}
    try:
        result = asyncio.run(runner.run(workload, kinds, args.repeats, server, offline,
                                        args.ttft_slo_ms, args.tpot_slo_ms, probe_interval=args.probe_interval))
    finally:
        if server is not None:
            server.close()
    result["settings"].update(engine_cpus=sorted(engine_cpus or ()), client_cpus=sorted(client_cpus or ()),
                              api_cpus=sorted(api_cpus or ()))
    print(overhead_table(result))
    if len(kinds) > 1:
        judged = paired.judge(result)
        result["paired"] = paired.as_json(judged)
        print(paired.table(judged, kinds[0]))
    if args.out:
        results.save(result, args.out)
        print(f"wrote {args.out}")
    return 0


def _api_cpus(text: str | None, client_cpus: frozenset[int] | None) -> frozenset[int] | None:
    """Where a started server's API process runs: beside the client (None, the default), or "any"
    CPU of this machine's (unpinned, as `llm serve --engine-cpus` leaves it), or a CPU list."""
    if text is None:
        return client_cpus
    if not client_cpus:
        raise UsageError("--api-cpus goes with --engine-cpus and --client-cpus")
    return frozenset(os.sched_getaffinity(0)) if text == "any" else _cpus(text, "--api-cpus")


def _cpus(text: str | None, option: str) -> frozenset[int] | None:
    """"0" or "0,2" or "0-3": CPUs of this machine."""
    from llm_engine.cli import parse_cpus

    if not text:
        return None
    try:
        cpus = parse_cpus(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None
    if not cpus <= os.sched_getaffinity(0):
        raise UsageError(f"{option}: CPUs {sorted(cpus)} are not all available here ({sorted(os.sched_getaffinity(0))})")
    return cpus


def overhead_table(result: dict) -> str:
    """Median tok/s and TTFT p50 per target and phase, relative to the first target (offline), and
    the serving process's CPU ms per output token outside its engine threads and the ms per token
    its engine waited for a CPU, and the mean TTFT spent outside the engine (where measured)."""
    import statistics

    by_phase: dict[str, dict[str, dict]] = {}
    for key, entry in result["figures"].items():
        target, phase = key.split(" / ", 1)
        runs = entry["runs"]
        by_phase.setdefault(phase, {})[target] = {
            f: statistics.median(r.get(f, math.nan) for r in runs)
            for f in ("output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "serving_cpu_ms_per_token",
                      "engine_wait_ms_per_token", "ttft_outside_engine_ms")}
    lines = [f"{'phase':<16} {'target':<8} {'tok/s':>9} {'vs first':>9} {'TTFT p50':>10} {'vs first':>9} {'TPOT p50':>9}"
             f" {'serving CPU ms/tok':>19} {'engine wait ms/tok':>19} {'TTFT outside engine':>20}"]
    for phase, targets in by_phase.items():
        first = next(iter(targets.values()))
        for target, f in targets.items():
            lines.append(f"{phase:<16} {target:<8} {f['output_tokens_per_s']:>9.1f} "
                         f"{f['output_tokens_per_s'] / first['output_tokens_per_s'] - 1:>+9.1%} "
                         f"{f['ttft_p50_ms']:>8.1f}ms {f['ttft_p50_ms'] / first['ttft_p50_ms'] - 1:>+9.1%} "
                         f"{f['tpot_p50_ms']:>7.1f}ms {f['serving_cpu_ms_per_token']:>19.3f} "
                         f"{f['engine_wait_ms_per_token']:>19.2f} {f['ttft_outside_engine_ms']:>18.2f}ms")
    return "\n".join(lines)


def run_suite(name: str, argv: list[str], prog: str) -> int:
    """A self-timed suite: its own options, `--repeats` measurements, one result JSON."""
    from benchmarks.framework import results

    module = import_module(SUITES[name])
    parser = Parser(prog=f"{prog} run {name}", description=module.__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1, help="measure this many times (compare needs 4+)")
    parser.add_argument("--out", "--json", dest="out", help="write the result JSON here")
    args = module.parse_args(argv, parser)
    if args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    result = results.new_result("suite", name, json.loads(json.dumps(vars(args), default=str)))
    result["directions"] = module.DIRECTIONS
    for repeat in range(args.repeats):
        if args.repeats > 1:
            print(f"== {name}: repeat {repeat + 1} of {args.repeats} ==", flush=True)
        report = module.run(args)
        for key, figures in module.figures(report).items():
            results.add_repeat(result, key, figures)
    result["report"] = report  # the last repeat's every detail, as the suite printed it
    if args.out:
        results.save(result, args.out)
        print(f"wrote {args.out}")
    return 0


def load_results(*paths: str) -> list[dict]:
    from benchmarks.framework import results

    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise UsageError(f"no result file {missing[0]}")
    try:
        return [results.load(p) for p in paths]
    except (ValueError, KeyError) as exc:
        raise UsageError(f"not a result file: {exc}") from None


def cmd_compare(args) -> int:
    from benchmarks.framework import results

    baseline, current = load_results(args.baseline, args.current)
    verdicts = results.compare(baseline, current, args.figures.split(",") if args.figures else None,
                               args.alpha, args.min_change)
    print(results.table(verdicts, baseline, current))
    regressions = [v for v in verdicts if v.status == "regression"]
    print(f"{len(regressions)} regression(s) in {len(verdicts)} figures")
    return 1 if regressions else 0


def cmd_paired(args) -> int:
    """Judge a stored overhead run again (e.g. with another load threshold), with no rerun."""
    from benchmarks.framework import paired

    if args.loaded_wait_ms < 0:
        raise UsageError("--loaded-wait-ms must be 0 or more")
    [result] = load_results(args.result)
    if result.get("kind") != "workload" or len(result["settings"].get("targets", ())) < 2:
        raise UsageError(f"{args.result} is not a workload run of two or more targets")
    judged = paired.judge(result, loaded_wait_ms=args.loaded_wait_ms)
    print(paired.table(judged, result["settings"]["targets"][0], args.loaded_wait_ms))
    return 0


def cmd_gate(args) -> int:
    from benchmarks.framework import gate

    return gate.main(args)


def cmd_report(args) -> int:
    from benchmarks.framework import report

    load_results(*args.results)
    report.write(args.results, args.out)
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks") -> int:
    """Run one command; bad input prints one line and returns 2."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["run"] and len(argv) > 1 and argv[1] in SUITES:
            return run_suite(argv[1], argv[2:], prog)
        return dispatch(argv, prog)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


def dispatch(argv: list[str], prog: str) -> int:
    parser = Parser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the named workloads")

    run = sub.add_parser("run", help="run a workload against targets, or a self-timed suite (`run NAME --help`)")
    run.add_argument("workload")
    run.add_argument("--targets", default="offline", help=f"comma list of {', '.join(TARGETS)}")
    run.add_argument("--model", help="local HF folder or .gguf (default: the built-in SmolLM2)")
    run.add_argument("--url", help="an existing server's base URL (else one is started)")
    run.add_argument("--grpc", help="that server's gRPC host:port")
    run.add_argument("--api-key")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="workload setting")
    run.add_argument("--repeats", type=int, default=3)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--max-num-seqs", type=int, default=32)
    run.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    run.add_argument("--tpot-slo-ms", type=float, default=100.0)
    run.add_argument("--probe-interval", type=float, default=1.0,
                     help="seconds between samples of memory and KV usage (0: none; a server renders /metrics "
                          "for each, CPU time that --targets' comparison of serving CPU per token should not count)")
    run.add_argument("--inject-slowdown", type=float, default=0.0, help="offline: sleep this fraction of each step")
    run.add_argument("--engine-cpus", help="pin every target's engine thread here, with one torch thread per "
                     "CPU; the rest (offline: this process's consumer; a server: its event loop and gRPC "
                     "threads) runs on --client-cpus with the client")
    run.add_argument("--client-cpus", help="pin this benchmark's client here (with --engine-cpus)")
    run.add_argument("--api-cpus", help="a started server's API process (event loop, gRPC threads) runs on "
                     "these CPUs, or 'any' (unpinned, as `llm serve --engine-cpus` leaves it: the engine's "
                     "CPUs too); default: --client-cpus, beside the client")
    run.add_argument("--server-engine", choices=("process", "thread"),
                     help="the started server's engine: its own process (--engine-process) or a thread of "
                          "the server's (--engine-thread); default: the server's default")
    run.add_argument("--out", help="write the result JSON here")

    comp = sub.add_parser("compare", help="compare a result with a baseline; exit 1 on a regression")
    comp.add_argument("baseline")
    comp.add_argument("current")
    comp.add_argument("--figures", help="comma list (default: every known figure)")
    comp.add_argument("--alpha", type=float, default=0.05)
    comp.add_argument("--min-change", type=float, default=0.05)

    from benchmarks.framework.paired import LOADED_WAIT_MS

    pair = sub.add_parser("paired", help="the protocol-overhead verdicts of a stored run, judged again")
    pair.add_argument("result")
    pair.add_argument("--loaded-wait-ms", type=float, default=LOADED_WAIT_MS,
                      help="leave out repeats where an engine waited more than this per output token for a CPU")

    gate = sub.add_parser("gate", help="CI: engine/Transformers ratios vs the stored baseline")
    gate.add_argument("--repeats", type=int, default=6)
    gate.add_argument("--baseline", help="default: the stored one for this CPU kind (gate.py's default_baseline)")
    gate.add_argument("--update-baseline", action="store_true")
    gate.add_argument("--inject-slowdown", type=float, default=0.0)
    gate.add_argument("--out", help="also write this run's result JSON here")
    gate.add_argument("--min-change", type=float, default=0.08)

    rep = sub.add_parser("report", help="PNG plots and a self-contained HTML report of result files")
    rep.add_argument("results", nargs="+")
    rep.add_argument("--out", default="benchmark-report.html")

    args = parser.parse_args(argv)
    if args.command == "list":
        from benchmarks.framework.workloads import WORKLOADS

        for name, fn in WORKLOADS.items():
            print(f"{name:<20} {(fn.__doc__ or '').strip().splitlines()[0]}")
        for name, module in SUITES.items():
            print(f"{name:<20} (self-timed) {(import_module(module).__doc__ or '').strip().splitlines()[0]}")
        return 0
    return {"run": cmd_run, "compare": cmd_compare, "paired": cmd_paired, "gate": cmd_gate,
            "report": cmd_report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
