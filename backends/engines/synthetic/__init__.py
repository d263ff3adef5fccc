"""The synthetic TEST AND BENCHMARK engine: no language, configurable timing and faults."""
