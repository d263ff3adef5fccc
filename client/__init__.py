"""Raygate's command-line client of a running gateway (`raygate deploy | scale | undeploy | list |
chat`). It speaks only HTTP, so it imports nothing of the server or the engines."""
