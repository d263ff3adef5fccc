"""The HTTP face of Raygate: FastAPI app, routes, SSE, errors and the CLI."""
