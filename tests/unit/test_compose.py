"""Static checks of docker/compose.yaml and docker/Dockerfile (no Docker engine runs here).

Every service must have a pinned image or a build context that exists, a
command the ``threes`` CLI accepts, ports and health checks that agree with
the example pipeline YAML (health checks on the token-free ``/healthz`` of
endpoints bound to the container's addresses, with the token from the
environment), and mounted files that exist. The example YAML is
validated with each service's environment, and the endpoints it resolves to
must be services of the compose file listening on those ports with those
credentials.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import typer
import typer.main
import yaml

from threes.cli import app
from threes.config import load_pipeline

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
CONFIG_IN_CONTAINER = "/etc/threes/pipeline.yaml"
INFRA = {"kafka", "postgres", "elasticsearch", "minio"}
THREES = {"load", "sources", "stream", "sync", "replay"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


HOST_ENV = {"THREES_METRICS_TOKEN": "compose-test-token"}
"""The variables of the shell that runs ``docker compose up`` (compose interpolates ``${...}`` from it)."""


def interpolate(value: str, host_env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` (the error raised as ``KeyError``)."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        found = host_env.get(name) or None
        if found is not None:
            return found
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return arg if op == ":-" else ""

    return re.sub(r"\$\{([A-Z0-9_]+)(?:(:-|:\?)([^}]*))?\}", one, value)


def _env(service: dict[str, Any], host_env: dict[str, str] | None = None) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: interpolate(str(v), HOST_ENV if host_env is None else host_env) for k, v in env.items()}


def _published(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port."""
    out = {}
    for spec in service.get("ports", []):
        host, _, container = str(spec).rpartition(":")
        out[int(container.split("/")[0])] = int(host)
    return out


def _binds(service: dict[str, Any]) -> dict[str, Path]:
    """container path -> host path of bind mounts (relative to docker/)."""
    out = {}
    for spec in service.get("volumes", []):
        parts = str(spec).split(":")
        if parts[0].startswith((".", "/")):
            out[parts[1]] = (DOCKER / parts[0]).resolve()
    return out


def _pipeline(service: dict[str, Any]) -> Any:
    return load_pipeline(_binds(service)[CONFIG_IN_CONTAINER], environ=_env(service))


def test_every_service_is_expected_and_has_a_pinned_image_or_an_existing_build(services: dict[str, Any]) -> None:
    assert set(services) == INFRA | THREES
    for name, svc in services.items():
        if "build" in svc:
            context = (DOCKER / svc["build"]["context"]).resolve()
            assert context.is_dir(), f"{name}: build context {context} does not exist"
            dockerfile = context / svc["build"]["dockerfile"]
            assert dockerfile.is_file(), f"{name}: {dockerfile} does not exist"
            assert dockerfile == DOCKER / "Dockerfile"
        else:
            image = svc["image"]
            tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
            assert tag and tag != "latest" and re.search(r"\d", tag), f"{name}: image {image!r} is not pinned"
    assert {n for n, s in services.items() if "build" in s} == THREES


def _resolve(args: list[str]) -> tuple[Any, list[str]]:
    """Walk the threes command tree (typer's click commands) to the leaf command named by ``args``."""
    command = typer.main.get_command(app)
    rest = list(args)
    while hasattr(command, "get_command"):
        assert rest, f"{args}: names a command group, not a command"
        sub = command.get_command(typer.Context(command), rest[0])
        assert sub is not None, f"{args}: `threes` has no command {rest[0]!r}"
        command, rest = sub, rest[1:]
    return command, rest


def test_threes_commands_parse_with_the_cli(services: dict[str, Any]) -> None:
    for name in THREES:
        command_line = services[name]["command"]
        assert isinstance(command_line, list), f"{name}: write the command as a list"
        command, rest = _resolve(command_line)
        # click parses the arguments exactly as `threes ...` would: unknown options fail here
        command.make_context(f"threes {command_line[0]}", list(rest), resilient_parsing=False)
        assert CONFIG_IN_CONTAINER in rest, f"{name}: does not read the example YAML"


def test_dockerfile_builds_the_threes_command(services: dict[str, Any]) -> None:
    text = (DOCKER / "Dockerfile").read_text()
    base = re.search(r"^FROM\s+(\S+)", text, re.M).group(1)
    assert ":" in base and not base.endswith(":latest"), base
    for line in re.findall(r"^COPY\s+(.+)$", text, re.M):
        if line.startswith("--from="):  # from a build stage of the Dockerfile, not from the repository
            continue
        *sources, _target = shlex.split(line)
        for src in sources:
            if not src.startswith("--"):
                assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is not in the repository"
    assert re.search(r'^ENTRYPOINT \["threes"\]', text, re.M)
    # the real-time mode's lookup jar is built in the image (it is not in the repository)
    assert re.search(r"^COPY --from=jvm \S+threes-lookup\.jar \S*stream_app/jars/", text, re.M)
    assert "pip install" in text
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".threes", ".git"} <= set(ignore)
    assert {s["image"] for n, s in services.items() if n in THREES} == {"threes:0.1.0"}


def test_mounted_files_exist_and_the_example_yaml_validates_in_every_service(services: dict[str, Any]) -> None:
    for name in THREES:
        binds = _binds(services[name])
        assert CONFIG_IN_CONTAINER in binds, f"{name}: the example YAML is not mounted"
        assert binds[CONFIG_IN_CONTAINER] == ROOT / "examples/nycflights13/pipeline.yaml"
        for host in binds.values():
            assert host.exists(), f"{name}: mounted {host} does not exist"
        _pipeline(services[name])  # raises ConfigError listing every problem


def test_endpoints_of_the_yaml_are_compose_services_with_matching_ports_and_credentials(
    services: dict[str, Any],
) -> None:
    pipeline = _pipeline(services["sync"])
    host, port = pipeline.kafka.bootstrap_servers.split(":")
    assert host == "kafka"
    kafka_env = _env(services["kafka"])
    assert f"PLAINTEXT://:{port}" in kafka_env["KAFKA_LISTENERS"]
    assert f"PLAINTEXT://kafka:{port}" in kafka_env["KAFKA_ADVERTISED_LISTENERS"]
    controller = kafka_env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split("@")[1]
    assert f"CONTROLLER://:{controller.split(':')[1]}" in kafka_env["KAFKA_LISTENERS"]

    pg = pipeline.connections["postgres"].sqlalchemy_url()
    pg_env = _env(services["postgres"])
    assert (pg.host, pg.port) == ("postgres", 5432)
    assert (pg.username, pg.password, pg.database) == (
        pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"], pg_env["POSTGRES_DB"],
    )
    assert 5432 in _published(services["postgres"])

    es = urlparse(pipeline.connections["elasticsearch"].hosts[0])
    assert (es.hostname, es.port) == ("elasticsearch", 9200)
    assert 9200 in _published(services["elasticsearch"])

    s3 = pipeline.connections["s3"]
    endpoint = urlparse(s3.endpoint_url)
    minio_env = _env(services["minio"])
    assert (endpoint.hostname, endpoint.port) == ("minio", 9000)
    assert s3.access_key_id == minio_env["MINIO_ROOT_USER"]
    assert s3.secret_access_key.get_secret_value() == minio_env["MINIO_ROOT_PASSWORD"]
    assert s3.path_style


def test_host_ports_are_unique_and_match_the_native_local_stack(services: dict[str, Any]) -> None:
    from threes.local import Endpoints

    hosts = [h for svc in services.values() for h in _published(svc).values()]
    assert len(hosts) == len(set(hosts)), f"a host port is published twice: {sorted(hosts)}"
    local = Endpoints.local()
    assert _published(services["kafka"])[19092] == int(local.kafka_bootstrap.rsplit(":", 1)[1])
    assert _published(services["postgres"])[5432] == urlparse(local.postgres_url).port
    assert _published(services["elasticsearch"])[9200] == urlparse(local.elasticsearch_url).port
    assert _published(services["minio"])[9000] == urlparse(local.s3_endpoint_url).port
    assert "HOST://localhost:19092" in _env(services["kafka"])["KAFKA_ADVERTISED_LISTENERS"]


LONG_RUNNING = ("sources", "stream", "sync")


def _health_url(service: dict[str, Any]) -> tuple[str, int]:
    """``(path, port)`` the service's health check requests (its ``python -c`` program, run with the port)."""
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], test
    url = re.search(r"f'(http://[^']+)'", test[3]).group(1).replace("{sys.argv[1]}", test[4])
    parsed = urlparse(url)
    assert parsed.hostname == "127.0.0.1"  # inside the container: the 0.0.0.0 bind answers there too
    return parsed.path, int(parsed.port or 80)


def test_health_checks_use_the_token_free_path_of_the_metrics_ports_the_yaml_declares(
    services: dict[str, Any],
) -> None:
    from kernel.status.guard import UNGUARDED

    pipeline = _pipeline(services["stream"])
    path, port = _health_url(services["stream"])
    assert path in UNGUARDED and port == pipeline.stream.metrics_port and port in _published(services["stream"])
    sync_ports = {s.metrics_port for s in pipeline.sync}
    assert None not in sync_ports and sync_ports == set(_published(services["sync"]))
    path, port = _health_url(services["sync"])
    assert path in UNGUARDED and port in sync_ports
    sources_cmd = services["sources"]["command"]
    metrics_port = int(sources_cmd[sources_cmd.index("--metrics-port") + 1])
    path, port = _health_url(services["sources"])
    assert path in UNGUARDED and port == metrics_port and port in _published(services["sources"])
    for name in INFRA:
        assert services[name]["healthcheck"]["test"][0] == "CMD", f"{name}: no health check"
    assert "localhost:9092" in services["kafka"]["healthcheck"]["test"]
    assert any("localhost:9200/_cluster/health" in part for part in services["elasticsearch"]["healthcheck"]["test"])


def test_the_endpoints_bind_the_container_and_need_the_token_from_the_environment(services: dict[str, Any]) -> None:
    """Published ports reach the container's interface, not its 127.0.0.1: the processes bind 0.0.0.0 with a token."""
    for name in LONG_RUNNING:
        env = _env(services[name])
        assert env["THREES_METRICS_HOST"] == "0.0.0.0", name
        assert env["THREES_METRICS_TOKEN"] == HOST_ENV["THREES_METRICS_TOKEN"], name  # from the host, not the file
        with pytest.raises(KeyError, match="THREES_METRICS_TOKEN"):  # compose refuses to start without one
            _env(services[name], host_env={})
    pipeline = _pipeline(services["sync"])
    for entry in [pipeline.stream, *pipeline.sync]:
        assert entry.metrics_host == "0.0.0.0"
        assert entry.metrics_token.get_secret_value() == HOST_ENV["THREES_METRICS_TOKEN"]
    command, rest = _resolve(services["sources"]["command"])  # source run reads $THREES_METRICS_HOST
    import os

    os.environ["THREES_METRICS_HOST"] = "0.0.0.0"
    try:
        assert command.make_context("threes source run", list(rest)).params["metrics_host"] == "0.0.0.0"
    finally:
        del os.environ["THREES_METRICS_HOST"]


def test_depends_on_conditions_are_satisfiable(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            condition = spec["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; it has no health check"
            elif condition == "service_completed_successfully":
                assert services[dep].get("restart") == "no", f"{dep} is a one-shot service: restart must be 'no'"
            else:
                assert condition == "service_started"
    # the pipeline starts in order: reference data before sources, everything before the replay
    assert services["sources"]["depends_on"]["load"]["condition"] == "service_completed_successfully"
    assert set(services["replay"]["depends_on"]) == {"sources", "stream", "sync"}


def test_replay_and_state_paths_agree_with_the_yaml(services: dict[str, Any], compose: dict[str, Any]) -> None:
    pipeline = _pipeline(services["replay"])
    cmd = services["replay"]["command"]
    assert cmd[cmd.index("--topic") + 1] == pipeline.stream.events.topic
    state = next(s.split(":")[1] for s in services["stream"]["volumes"] if s.startswith("threes-state:"))
    assert pipeline.stream.checkpoint_location.startswith(state + "/")
    named = {s.split(":")[0] for svc in services.values() for s in svc.get("volumes", []) if not s.startswith(".")}
    assert named <= set(compose["volumes"])
