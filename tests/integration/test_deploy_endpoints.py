"""The Kubernetes manifests' and compose services' commands as real processes, probed as the kubelet and Prometheus would.

No Docker or kubelet runs here, so each workload's container is stood in for by a process
started with the container's exact arguments and environment (the ConfigMaps and Secrets of
``docker/k8s``, the ``environment`` of ``docker/compose.yaml`` as compose interpolates it),
with two substitutions only: the bind address ``0.0.0.0`` (every address of the pod) becomes
``127.0.0.2``, the "pod IP" here, another address than the ``127.0.0.1`` the endpoints bind by
default; and the endpoints of the systems point at this machine's stack (Kafka) or at a closed
port (the databases: the processes must not write the shared stack's demo data). Then each
probe of the manifest is an HTTP GET to ``127.0.0.2:<port><path>`` without a token, as the kubelet
sends it, and must succeed; Prometheus's scrape (``/metrics``) and ``/status.json`` without the
token are refused (401), and with the Secret's token, read from a file as Prometheus's
``credentials_file``, the scrape answers. A compose health check runs as its own process.

The stream job's command needs Spark and its topics, so it is stood in for by its endpoint
alone: ``stream_app.metrics.serve`` with the ``stream:`` entry the container's environment
resolves (its ``metrics_port``, ``metrics_host``, ``metrics_token``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.sync.helpers import wait_until
from tests.unit.test_compose import HOST_ENV, interpolate
from tests.unit.test_k8s import K8S, LONG_RUNNING, _by_kind, _container, _documents, _environment, _workloads

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "nycflights13" / "pipeline.yaml"
THREES = str(Path(sys.executable).with_name("threes"))
POD_IP = "127.0.0.2"
CLOSED = "127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once

STREAM_ENDPOINT = """
import signal, threading
from threes.config import load_pipeline
from stream_app import metrics
cfg = load_pipeline({config!r}).stream
token = cfg.metrics_token.get_secret_value() if cfg.metrics_token is not None else None
metrics.serve(cfg.metrics_port, cfg.metrics_host, token)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
"""


def _manifests() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [doc for name in kustomization["resources"] for doc in _documents(name)]


def _local(env: dict[str, str], kafka: str, tmp: Path) -> dict[str, str]:
    """The container's environment on this machine (see the module docstring): only these substitutions."""
    out = {
        **env,
        "THREES_KAFKA_BOOTSTRAP": kafka,
        "THREES_POSTGRES_URL": f"postgresql+psycopg://x:y@{CLOSED}/x",
        "THREES_ELASTICSEARCH_URL": f"http://{CLOSED}",
        "THREES_S3_ENDPOINT_URL": f"http://{CLOSED}",
        "THREES_CHECKPOINTS": str(tmp / "checkpoints"),
    }
    assert out["THREES_METRICS_HOST"] == "0.0.0.0"
    out["THREES_METRICS_HOST"] = POD_IP
    # what runs the command here: the interpreter's PATH and this checkout on PYTHONPATH
    out.update({"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(tmp)})
    return out


def _get(port: int, path: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://{POD_IP}:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _answers(port: int) -> bool:
    try:
        _get(port, "/healthz")
    except OSError:
        return False
    return True


class Started:
    """A workload's process, stopped with SIGTERM when the test leaves it."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path):
        self.log = cwd / "process.log"
        if args[:2] == ["stream", "run"]:
            command = [sys.executable, "-c", STREAM_ENDPOINT.format(config=str(EXAMPLE))]
        else:
            command = [THREES, *[str(EXAMPLE) if a == "/etc/threes/pipeline.yaml" else a for a in args]]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)

    def wait_serving(self, ports: list[int]) -> None:
        def serving() -> bool:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            return all(_answers(p) for p in ports)

        wait_until(serving, 90, f"the endpoint on {POD_IP}:{ports}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture
def started() -> Iterator[list[Started]]:
    running: list[Started] = []
    yield running
    for process in running:
        process.stop()


def _scrape_like_prometheus(port: int, token_file: Path) -> None:
    """Prometheus's scrape of the pod: refused without the token, answered with the Secret's token from a file."""
    assert _get(port, "/metrics") == 401
    assert _get(port, "/status.json") == 401
    assert _get(port, "/metrics", "not-the-token") == 401
    request = urllib.request.Request(
        f"http://{POD_IP}:{port}/metrics", headers={"Authorization": f"Bearer {token_file.read_text().strip()}"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        assert resp.status == 200 and b"# HELP" in resp.read()


@pytest.mark.parametrize("workload", LONG_RUNNING)
def test_each_kubernetes_workload_answers_its_probes_on_the_pod_ip(
    workload: str, endpoints: Any, tmp_path: Path, started: list[Started]
) -> None:
    manifests = _manifests()
    container = _container(_workloads(manifests)[workload])
    env = _local(_environment(manifests, container), endpoints.kafka_bootstrap, tmp_path)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    process = Started(container["args"], env, tmp_path)
    started.append(process)
    process.wait_serving([ports["metrics"]])
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if kind in container:
            probe = container[kind]["httpGet"]
            port = ports.get(probe["port"], probe["port"])
            assert _get(port, probe["path"]) == 200, (kind, probe)  # no token: the kubelet sends none
    token_file = tmp_path / "THREES_METRICS_TOKEN"  # Prometheus's credentials_file, from the Secret
    token_file.write_text(_by_kind(manifests, "Secret")["threes-metrics-token"]["stringData"]["THREES_METRICS_TOKEN"])
    annotations = _workloads(manifests)[workload]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"
    _scrape_like_prometheus(int(annotations["prometheus.io/port"]), token_file)


@pytest.mark.parametrize("service", ["sources", "stream", "sync"])
def test_each_compose_service_passes_its_health_check_and_refuses_scrapes_without_the_token(
    service: str, endpoints: Any, tmp_path: Path, started: list[Started]
) -> None:
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    svc = compose["services"][service]
    env = _local(
        {k: interpolate(str(v), HOST_ENV) for k, v in svc["environment"].items()}, endpoints.kafka_bootstrap, tmp_path
    )
    ports = [int(str(p).rpartition(":")[2]) for p in svc["ports"]]
    process = Started(svc["command"], env, tmp_path)
    started.append(process)
    process.wait_serving(ports)
    test = svc["healthcheck"]["test"]
    assert test[0] == "CMD"
    # in the container the check reaches the 0.0.0.0 bind through 127.0.0.1; here the bind is the "pod IP"
    check = [sys.executable if a == "python" else re.sub(r"127\.0\.0\.1", POD_IP, a) for a in test[1:]]
    done = subprocess.run(check, capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr
    token_file = tmp_path / "token"
    token_file.write_text(HOST_ENV["THREES_METRICS_TOKEN"])
    for port in ports:
        assert _get(port, "/readyz") == 200
        _scrape_like_prometheus(port, token_file)
