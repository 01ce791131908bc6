"""Small real training jobs used by the demo, the tests and the benchmarks."""
