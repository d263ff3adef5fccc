"""Raygate benchmark harness (see bench/__main__.py and README.md, Performance)."""
