"""Tests that every backend must pass, written once and run against each backend's gateway.

A module here holds `test_*` functions that take only the fixtures every end-to-end gateway offers
(`client`, `base_url`, `gateway`, `backend`, `anthropic_client` ...), plus the helpers they use.
pytest never collects it (not a `test_*.py` file); a test module collects what it imports by
name: tests/e2e/test_chat.py imports the chat suite, so it runs on the default (llama.cpp)
gateway of tests/e2e/conftest.py, and tests/e2e/vllm/test_vllm_openai_suite.py imports the same
functions, so they run again on the vLLM gateway that tests/e2e/vllm/conftest.py puts behind those
fixture names. No test module imports another test module. A test that holds on one backend only
stays in that backend's test module.

tests/conftest.py registers tests.support for pytest's assertion rewriting, so a failed `assert`
here reports its values as it would in a test module.
"""
