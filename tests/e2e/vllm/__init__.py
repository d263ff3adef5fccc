"""The tests against models served by vLLM: a package, so that its gateway is package-scoped."""
