"""Raygate benchmark harness (see bench/__main__.py and docs/performance.md)."""
