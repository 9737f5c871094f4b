"""The local stack's services are one registry (``threes.local.registry.SERVERS``) that every reader derives from."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from threes.demo.config_docs import render
from threes.local import SERVERS, SERVICES, LocalStack, LocalStackError
from threes.local.cli import local_app
from threes.local.endpoints import Endpoints
from threes.local.registry import _START_ORDER, ENV_VARS


@pytest.fixture
def no_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No ``THREES_*`` variable points anywhere; the stack's folder is an empty one; no port answers."""
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("threes.local.discovery.port_open", lambda port, *args, **kwargs: False)
    monkeypatch.setenv("THREES_HOME", str(tmp_path))
    return tmp_path


def test_names_and_start_order_are_those_the_commands_always_had() -> None:
    assert [server.name for server in SERVERS] == ["kafka", "postgres", "elasticsearch", "s3", "mysql"]
    assert SERVICES == ("kafka", "postgres", "elasticsearch", "s3", "mysql", "spark")
    # the slowest first (Elasticsearch), waited for in parallel
    assert _START_ORDER == ("elasticsearch", "kafka", "postgres", "s3", "mysql", "spark")


def test_every_endpoint_has_exactly_one_variable_from_its_service() -> None:
    assert sorted(ENV_VARS) == sorted(f.name for f in dataclasses.fields(Endpoints))
    assert len(set(ENV_VARS.values())) == len(ENV_VARS)
    assert set(ENV_VARS.values()) == {
        "THREES_KAFKA_BOOTSTRAP",
        "THREES_POSTGRES_URL",
        "THREES_ELASTICSEARCH_URL",
        "THREES_S3_ENDPOINT_URL",
        "THREES_S3_ACCESS_KEY_ID",
        "THREES_S3_SECRET_ACCESS_KEY",
        "THREES_S3_REGION",
        "THREES_MYSQL_URL",
        "THREES_SPARK_MASTER",
        "THREES_KAFKA_SASL_BOOTSTRAP",
        "THREES_KAFKA_SASL_USERNAME",
        "THREES_KAFKA_SASL_PASSWORD",
        "THREES_TLS_CA",
    }
    for server in SERVERS:  # a service's override variable is its first endpoint's
        assert next(iter(server.endpoint_vars.values())) == server.env_var


def test_status_lists_the_registry_then_the_cluster(no_overrides: Path) -> None:
    status = LocalStack(no_overrides).status()
    assert [s.name for s in status] == [
        "kafka",
        "postgres",
        "elasticsearch",
        "s3",
        "mysql",
        "spark-master",
        "spark-worker-1",
        "spark-worker-2",
    ]
    assert not any(s.running or s.external for s in status)


def test_an_unknown_service_names_every_known_one(no_overrides: Path) -> None:
    with pytest.raises(LocalStackError) as info:
        LocalStack(no_overrides).up(["kafka", "redis"])
    assert "redis" in str(info.value)
    assert all(name in str(info.value) for name in SERVICES)


def test_env_prints_every_endpoint_variable(no_overrides: Path) -> None:
    result = CliRunner().invoke(local_app, ["env"])
    assert result.exit_code == 0, result.output
    printed = dict(line.removeprefix("export ").split("=", 1) for line in result.output.splitlines())
    local = Endpoints.local(no_overrides)
    # THREES_SPARK_MASTER only when set: the cluster starts on request
    assert set(printed) == set(ENV_VARS.values()) - {"THREES_SPARK_MASTER"}
    for field, var in ENV_VARS.items():
        if var in printed:
            assert shlex.split(printed[var]) == [str(getattr(local, field))]


def test_the_config_reference_lists_every_service_and_its_variables() -> None:
    section = render().split('<a id="local-stack"></a>', 1)[1]
    for server in SERVERS:
        (row,) = [line for line in section.splitlines() if line.startswith(f"| `{server.name}` |")]
        assert all(f"`{var}`" in row for var in server.endpoint_vars.values()), row
        assert all(str(port) in row for port in server.ports), row
    assert "| `spark` |" in section and "`THREES_SPARK_MASTER`" in section and "`THREES_TLS_CA`" in section
