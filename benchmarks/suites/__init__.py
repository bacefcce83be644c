"""Self-timed workloads of the framework: benchmarks that build their own engines (offline
throughput against Transformers and llama.cpp, speculative decoding, the data-parallel router,
vision TTFT, structured outputs) rather than sending requests to a target.

Each module offers `parse_args(argv, parser)` (its options, added to the framework's parser),
`run(args) -> report` (measures once, prints its tables, returns every figure as a dict),
`figures(report) -> {key: {figure: value}}` (what a repeat stores in the result JSON, so
`compare` and `report` work on it) and `DIRECTIONS` (figure -> higher is better).
"""

# name -> module; `python -m benchmarks run NAME --help` shows each one's options
SUITES = {
    "throughput": "benchmarks.suites.throughput",
    "spec": "benchmarks.suites.spec",
    "router": "benchmarks.suites.router",
    "vision-ttft": "benchmarks.suites.vision_ttft",
    "structured": "benchmarks.suites.structured",
    "beam": "benchmarks.suites.beam",
    # suites whose code stays at the script path their owners and notes name (`python benchmarks/X.py`
    # runs them through the framework too, with --repeats and --out)
    "disagg": "benchmarks.llm_disagg",
    "batched-vs-llamacpp": "benchmarks.llm_batched_vs_llamacpp",
    "1b-int4": "benchmarks.llm_1b_int4",
    "single-stream": "benchmarks.llm_single_stream",
    "spec-draft": "benchmarks.llm_spec_draft",
}
