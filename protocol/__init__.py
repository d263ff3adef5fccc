"""OpenAI wire format and engine-neutral types.

This package imports only pydantic and the standard library, so both the HTTP layer (`server/`) and
the engines (`backends/`) can share one definition of every shape that crosses a boundary.
"""
