"""Real architectures built from code (no downloads), used by the demo, tests and benchmarks."""
