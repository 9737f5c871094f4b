"""A service of the local stack is found by its ports and health, not by the folder it was started from."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kernel.exceptions import ThreesError
from threes.local import LocalStack, LocalStackError, discovery
from threes.local.common import Layout
from threes.local.discovery import Found, Presence, decide, find, started_from, status_of, with_ca
from threes.local.endpoints import Endpoints
from threes.local.registry import ENV_VARS
from threes.local.service import Service
from threes.local.tls import tls_dir


def never() -> bool:
    raise AssertionError("the health probe must not run")


@pytest.mark.parametrize(
    ("recorded", "held", "healthy", "leftover", "expected"),
    [
        (True, [19200], never, False, Presence.OURS),  # our record: ours, the probe is up's business
        (False, [], never, False, Presence.DOWN),  # nothing listens: start it
        (False, [19200], lambda: True, False, Presence.ELSEWHERE),  # answers as the service: use it
        (False, [19200], lambda: False, False, Presence.HELD),  # something else holds the port
        (False, [19200], never, True, Presence.DOWN),  # a leftover of this folder: up stops it, starts anew
    ],
)
def test_decide(recorded: bool, held: list[int], healthy: Any, leftover: bool, expected: Presence) -> None:
    assert decide(recorded, held, healthy, leftover) is expected


class Fake(Service):
    """A service on a port the test chooses, healthy or not as the test says."""

    name = "fake"
    title = "Fake"
    env_var: ClassVar[str] = "THREES_FAKE_URL"
    endpoint_vars: ClassVar[dict[str, str]] = {}

    def __init__(self, layout: Layout, port: int, healthy: bool) -> None:
        super().__init__(layout)
        self.ports = (port,)
        self.healthy = healthy
        self.probed_with: list[Endpoints] = []

    def probe(self, endpoints: Endpoints) -> None:
        self.probed_with.append(endpoints)
        if not self.healthy:
            raise ConnectionError("unexpected reply\nsecond line")

    def address(self, endpoints: Endpoints) -> str:
        return f"127.0.0.1:{self.ports[0]}"


@pytest.fixture
def listener() -> Iterator[int]:
    """A plain TCP listener on a free loopback port (it accepts, never answers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def endpoints_of(home: Path) -> Endpoints:
    return Endpoints.from_env({}, home=home)


def test_a_port_answering_the_probe_is_the_service_started_elsewhere(tmp_path: Path, listener: int) -> None:
    svc = Fake(Layout(tmp_path), listener, healthy=True)
    found = find(svc, endpoints_of(tmp_path))
    assert found.presence is Presence.ELSEWHERE and found.port == listener
    st = status_of(svc, endpoints_of(tmp_path), external=False)
    assert st.running and st.elsewhere and not st.problem


def test_a_port_held_by_something_else_is_one_line_naming_port_service_and_override(
    tmp_path: Path, listener: int
) -> None:
    svc = Fake(Layout(tmp_path), listener, healthy=False)
    assert find(svc, endpoints_of(tmp_path)).presence is Presence.HELD
    st = status_of(svc, endpoints_of(tmp_path), external=False)
    assert not st.running and not st.elsewhere
    assert "\n" not in st.problem
    assert f"127.0.0.1:{listener}" in st.problem and "Fake" in st.problem and "THREES_FAKE_URL" in st.problem
    assert "does not answer as Fake (ConnectionError: unexpected reply)" in st.problem


def test_free_ports_are_down_without_probing(tmp_path: Path, free_port: int) -> None:
    svc = Fake(Layout(tmp_path), free_port, healthy=True)
    assert find(svc, endpoints_of(tmp_path)).presence is Presence.DOWN
    assert svc.probed_with == []


def test_the_folder_a_process_was_started_from_is_read_from_its_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "clone" / ".threes"
    line = (
        f"/usr/bin/java -Dlog=/var/x.log -cp {home}/kafka/lib/*:/opt/y.jar kafka.Kafka {home}/kafka/server.properties"
    )
    monkeypatch.setattr(discovery, "cmdline", lambda pid: line)
    assert started_from(4242, "kafka") is None  # no PID record there: not a stack folder
    Layout(home).run.mkdir(parents=True)
    Layout(home).pid_file("kafka").write_text("{}")
    assert started_from(4242, "kafka") == home
    assert started_from(4242, "postgres") is None
    assert started_from(None, "kafka") is None


def test_probing_uses_a_ca_that_exists(tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    endpoints = endpoints_of(here)
    assert endpoints.tls_ca_location == str(tls_dir(Layout(here)) / "ca.pem")
    # neither folder has one: no TLS check (Kafka's probe skips its SASL_SSL listener)
    assert with_ca(endpoints, Layout(here), there).tls_ca_location == ""
    assert with_ca(endpoints, Layout(here), None).tls_ca_location == ""
    tls_dir(Layout(there)).mkdir(parents=True)
    (tls_dir(Layout(there)) / "ca.pem").write_text("ca")
    assert with_ca(endpoints, Layout(here), there).tls_ca_location == str(tls_dir(Layout(there)) / "ca.pem")
    # this folder's own CA wins; one given by THREES_TLS_CA is kept as given
    tls_dir(Layout(here)).mkdir(parents=True)
    (tls_dir(Layout(here)) / "ca.pem").write_text("ca")
    assert with_ca(endpoints, Layout(here), there) == endpoints
    given = Endpoints.from_env({"THREES_TLS_CA": "/nowhere/ca.pem"}, home=here)
    assert with_ca(given, Layout(here), there) == given


@pytest.fixture
def empty_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("THREES_HOME", str(tmp_path))
    return tmp_path


def test_up_uses_a_service_found_elsewhere_and_starts_nothing(
    empty_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision ``threes demo``'s stack phase (``LocalStack().up(...)``) relies on in an empty folder."""
    monkeypatch.setattr("threes.local.stack.find", lambda svc, endpoints: Found(Presence.ELSEWHERE, 1))

    def start(svc: Service) -> None:
        raise AssertionError(f"{svc.name} must not be started")

    monkeypatch.setattr(LocalStack, "_start", staticmethod(start))
    LocalStack().up(["postgres", "elasticsearch", "s3"])


def test_up_on_a_port_held_by_something_else_is_one_line(empty_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = Found(Presence.HELD, 19200, None, None, "ConnectionError: no HTTP")
    monkeypatch.setattr("threes.local.stack.find", lambda svc, endpoints: held)
    with pytest.raises(LocalStackError) as info:
        LocalStack().up(["elasticsearch"])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("port 127.0.0.1:19200 needed by Elasticsearch is already in use")
    assert "set THREES_ELASTICSEARCH_URL" in message


def test_a_local_stack_error_is_an_error_of_threes() -> None:
    """``threes.cli.run`` turns every ThreesError into one line: so a LocalStackError too."""
    assert issubclass(LocalStackError, ThreesError)


def test_env_without_the_other_folders_ca_leaves_out_sasl_and_says_so(
    empty_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from threes.local.cli import local_app

    # Kafka answers on its port, started from a folder that is not visible (another user's process)
    monkeypatch.setattr("threes.local.stack.find", lambda svc, endpoints: Found(Presence.ELSEWHERE, 19092))
    result = CliRunner().invoke(local_app, ["env"])
    assert result.exit_code == 0, result.output
    printed = dict(line.removeprefix("export ").split("=", 1) for line in result.stdout.splitlines())
    assert printed["THREES_KAFKA_BOOTSTRAP"] == "127.0.0.1:19092"
    assert not {"THREES_TLS_CA", "THREES_KAFKA_SASL_BOOTSTRAP", "THREES_KAFKA_SASL_PASSWORD"} & set(printed)
    assert "set THREES_TLS_CA" in result.stderr


def test_threes_demo_prints_a_held_port_as_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``threes demo`` in an empty folder printed as a traceback is one line now."""
    from typer.testing import CliRunner

    from threes.cli import app

    message = "port 127.0.0.1:19200 needed by Elasticsearch is already in use; stop that process, or set X"

    def run_demo(options: Any) -> None:
        raise LocalStackError(message)

    monkeypatch.setattr("threes.demo.cli._run_demo", run_demo)
    monkeypatch.setattr("threes.demo.cli._demo_config", lambda config: Path("pipeline.yaml"))
    result = CliRunner().invoke(app, ["demo", "--no-verify"])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert [line for line in result.output.splitlines() if line.strip()] == [f"error {message}"]
