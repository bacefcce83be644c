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
    "disagg": "benchmarks.llm_disagg",
}
