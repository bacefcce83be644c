"""The container files: docker-compose.yml is valid and wires the app to PostgreSQL, Redis and the LLM server;
the Dockerfile copies what exists and runs as a non-root user."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def test_docker_compose_config_is_valid():
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.fail("docker-compose is not installed (make test installs it: apt-get install docker-compose)")
    result = subprocess.run(
        [compose, "-f", "docker-compose.yml", "config"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    services = config["services"]
    assert {"app", "postgres", "redis"} <= set(services)
    app = services["app"]
    assert app["environment"]["CODEYARD_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert app["environment"]["CODEYARD_REDIS_URL"].startswith("redis://redis:")
    assert app["deploy"]["replicas"] >= 2
    assert {name: cond["condition"] for name, cond in app["depends_on"].items()} == {
        "postgres": "service_healthy", "redis": "service_healthy", "llm": "service_started"}
    # Replicas load no model: /v1 and the assistant go to the llm service's port.
    assert app["environment"]["CODEYARD_LLM_URL"] == "http://llm:8001"
    assert "--port" in services["llm"]["command"] and "8001" in services["llm"]["command"]
    for name in ("app", "postgres", "redis"):
        assert services[name]["healthcheck"]["test"], name
        assert services[name]["volumes"], name


def test_dockerfile_runs_as_non_root_and_installs_with_constraints():
    dockerfile = (REPO / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"pip install -c constraints\.txt \.", dockerfile)
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.M):
        for path in source.split():
            assert (REPO / path).exists(), f"Dockerfile copies {path}, which is missing"
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
