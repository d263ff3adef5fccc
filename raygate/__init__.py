"""Raygate: an OpenAI-compatible HTTP gateway that serves LLMs on Ray.

One installed namespace. The repository keeps its code in top-level folders (`server/`,
`backends/`, `protocol/`, `client/`); the entries beside this file are relative symbolic links to
them, so the source tree, an editable install and the wheel all import the same `raygate.*` names
and nothing else at the top level.
"""
