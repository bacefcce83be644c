"""The benchmark framework: workloads, targets, results, comparison, CI gate and report (see benchmarks/README.md)."""
