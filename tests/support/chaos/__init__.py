"""The chaos run (tests/e2e/test_ops_chaos.py): mixed traffic, a fault schedule, and what is watched."""
