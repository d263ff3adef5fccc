"""Engines and the Ray machinery that hosts them. Never imports an HTTP framework."""
