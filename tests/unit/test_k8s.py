"""Static checks of the Kubernetes manifests in docker/k8s (no cluster runs here).

Every manifest is validated, strictly (unknown fields are errors), against the
JSON schemas of the Kubernetes API that the ``kubernetes-validate`` package
ships. Then the manifests must agree with threes and with the example
pipeline: every container runs a real ``threes`` command (parsed by the CLI
itself), the mounted pipeline is ``examples/nycflights13/pipeline.yaml``
unchanged and validates with the containers' environment, probes hit the
metrics ports the YAML declares on the token-free paths (``/healthz``,
``/readyz``) of an endpoint bound to the pod's addresses, the metrics token
comes from a Secret and Prometheus sends it, every ``sync:`` entry has its
Deployment, secrets come from the Secrets only, and the stream job checkpoints
on object storage. ``tests/integration/test_deploy_endpoints.py`` starts the
workloads' commands with their environments as real processes and probes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.unit.test_compose import _resolve
from threes.config import load_pipeline

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "docker" / "k8s"
EXAMPLE = ROOT / "examples" / "nycflights13" / "pipeline.yaml"
CONFIG = "/etc/threes/pipeline.yaml"
# the Kubernetes API version the manifests are checked against (kubernetes-validate ships its schemas)
KUBERNETES_VERSION = "1.33.0"
APPLIED_ALONE = {"replay.yaml"}  # not in kustomization.yaml: applied once the workloads are available


def _documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def manifests(kustomization: dict[str, Any]) -> list[dict[str, Any]]:
    return [doc for name in [*kustomization["resources"], *sorted(APPLIED_ALONE)] for doc in _documents(name)]


def _by_kind(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


def _workloads(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] in ("Deployment", "Job")}


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def _environment(manifests: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment: its envFrom ConfigMaps and Secrets, then its own env."""
    configmaps, secrets = _by_kind(manifests, "ConfigMap"), _by_kind(manifests, "Secret")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps[source["configMapRef"]["name"]]["data"])
        else:
            env.update(secrets[source["secretRef"]["name"]]["stringData"])
    env.update({e["name"]: e["value"] for e in container.get("env", [])})
    return env


def test_every_file_is_listed_and_every_listed_file_exists(kustomization: dict[str, Any]) -> None:
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) | APPLIED_ALONE == files
    assert kustomization["namespace"] == "threes"


def test_every_manifest_is_valid_for_the_kubernetes_api(manifests: list[dict[str, Any]]) -> None:
    assert manifests
    for manifest in manifests:
        try:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            pytest.fail(f"{manifest['kind']} {manifest['metadata']['name']}: {where}: {exc.message}")


def test_a_broken_manifest_is_refused_by_the_schema_check() -> None:
    """The check above can fail: a misspelt field and a wrong type are errors."""
    deployment = _documents("sources.yaml")[0]
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    deployment = _documents("sources.yaml")[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "metrics"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_containers_run_threes_commands_that_parse_on_the_mounted_pipeline(manifests: list[dict[str, Any]]) -> None:
    workloads = _workloads(manifests)
    assert set(workloads) == {
        "threes-load-reference", "threes-sources", "threes-stream", "threes-sync-search", "threes-sync-warehouse",
        "threes-sync-archive", "threes-replay",
    }
    for name, workload in workloads.items():
        container = _container(workload)
        assert container["image"] == "threes:0.1.0", name  # docker/Dockerfile's image, as in compose.yaml
        assert "command" not in container, f"{name}: keep the image's ENTRYPOINT (threes); give args"
        command, rest = _resolve(container["args"])
        command.make_context(f"threes {container['args'][0]}", list(rest), resilient_parsing=False)
        assert CONFIG in rest, f"{name}: does not read the pipeline"
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        mount = mounts[str(Path(CONFIG).parent)]
        assert volumes[mount["name"]]["configMap"]["name"] == "threes-pipeline" and mount.get("readOnly"), name


def test_the_mounted_pipeline_is_the_example_and_validates_with_each_containers_environment(
    manifests: list[dict[str, Any]],
) -> None:
    pipeline_text = _by_kind(manifests, "ConfigMap")["threes-pipeline"]["data"]["pipeline.yaml"]
    assert pipeline_text == EXAMPLE.read_text(), (
        "docker/k8s/config.yaml's pipeline.yaml differs from examples/nycflights13/pipeline.yaml: copy it again"
    )
    for name, workload in _workloads(manifests).items():
        pipeline = load_pipeline(EXAMPLE, environ=_environment(manifests, _container(workload)))
        assert pipeline.kafka.bootstrap_servers == "kafka:9092", name
        assert "127.0.0.1" not in str(pipeline.connections["postgres"].url), name


LONG_RUNNING = ("threes-sources", "threes-stream", "threes-sync-search", "threes-sync-warehouse",
                "threes-sync-archive")
METRICS_TOKEN_SECRET = "threes-metrics-token"


def _metrics_port(pipeline: Any, name: str, container: dict[str, Any]) -> int:
    """The port the YAML (or the sources' --metrics-port) serves the workload's endpoint on."""
    if name == "threes-sources":
        args = container["args"]
        return int(args[args.index("--metrics-port") + 1])
    if name == "threes-stream":
        return int(pipeline.stream.metrics_port)
    return int(next(s.metrics_port for s in pipeline.sync if f"threes-sync-{s.name}" == name))


def test_probes_use_the_token_free_paths_of_the_port_the_process_binds_off_loopback(
    manifests: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kubelet probes the pod IP without a token: the process must bind it, and the paths need none."""
    from kernel.status.guard import UNGUARDED

    workloads = _workloads(manifests)
    for name in LONG_RUNNING:
        container = _container(workloads[name])
        env = _environment(manifests, container)
        pipeline = load_pipeline(EXAMPLE, environ=env)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == _metrics_port(pipeline, name, container), name
        paths = {kind: container[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")
                 if kind in container}
        assert paths["readinessProbe"]["path"] == "/readyz" and paths["livenessProbe"]["path"] == "/healthz", name
        for kind, probe in paths.items():
            assert probe["path"] in UNGUARDED, (name, kind)  # answered without the token
            assert ports.get(probe["port"], probe["port"]) == ports["metrics"], (name, kind)
        # the process binds every address of the pod, not 127.0.0.1 (the probes connect to the pod IP)
        assert env["THREES_METRICS_HOST"] == "0.0.0.0", name
        if name == "threes-sources":  # `threes source run --metrics-host` reads $THREES_METRICS_HOST
            monkeypatch.setenv("THREES_METRICS_HOST", env["THREES_METRICS_HOST"])
            command, rest = _resolve(container["args"])
            assert command.make_context("threes source run", list(rest)).params["metrics_host"] == "0.0.0.0"
            monkeypatch.delenv("THREES_METRICS_HOST")
        else:
            entries = [pipeline.stream] if name == "threes-stream" else [
                s for s in pipeline.sync if f"threes-sync-{s.name}" == name]
            for entry in entries:
                assert entry.metrics_host == "0.0.0.0", name
                assert entry.metrics_token.get_secret_value() == env["THREES_METRICS_TOKEN"], name


def test_the_metrics_token_comes_from_a_secret_and_prometheus_sends_it(manifests: list[dict[str, Any]]) -> None:
    from kernel.status.guard import UNGUARDED

    secret = _by_kind(manifests, "Secret")[METRICS_TOKEN_SECRET]
    token = secret["stringData"]["THREES_METRICS_TOKEN"]
    workloads = _workloads(manifests)
    for name in LONG_RUNNING:
        container = _container(workloads[name])
        assert {"secretRef": {"name": METRICS_TOKEN_SECRET}} in container["envFrom"], name
        assert all(e["name"] != "THREES_METRICS_TOKEN" for e in container.get("env", [])), name
        annotations = workloads[name]["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/path"] == "/metrics" and "/metrics" not in UNGUARDED
    # no ConfigMap (nor the pipeline) holds the token or sets the variable
    for configmap in _by_kind(manifests, "ConfigMap").values():
        assert token not in yaml.safe_dump(configmap) and "THREES_METRICS_TOKEN" not in configmap["data"]
    # Prometheus's job reads the token from that Secret, mounted as a file (the operator's spec.secrets path)
    scrape = yaml.safe_load(_by_kind(manifests, "ConfigMap")["threes-prometheus"]["data"]["scrape-config.yaml"])
    (job,) = scrape["scrape_configs"]
    assert job["authorization"] == {
        "type": "Bearer", "credentials_file": f"/etc/prometheus/secrets/{METRICS_TOKEN_SECRET}/THREES_METRICS_TOKEN"}
    keep = job["relabel_configs"][0]
    assert keep["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
    assert keep["action"] == "keep"


def test_scaling_is_by_replicas_and_consumer_groups(manifests: list[dict[str, Any]]) -> None:
    workloads = _workloads(manifests)
    pipeline = load_pipeline(EXAMPLE, environ=_environment(manifests, _container(workloads["threes-stream"])))
    # one Deployment per sync service, running only that service: its replicas are one consumer group
    sync = {n: w for n, w in workloads.items() if n.startswith("threes-sync-")}
    assert {n.removeprefix("threes-sync-") for n in sync} == {s.name for s in pipeline.sync}
    for name, workload in sync.items():
        args = _container(workload)["args"]
        assert args[args.index("--service") + 1] == name.removeprefix("threes-sync-")
        assert workload["spec"]["replicas"] >= 2
    # the sources' replicas share the tasks through a worker group
    sources = workloads["threes-sources"]
    assert sources["spec"]["replicas"] >= 2 and "--group" in _container(sources)["args"]
    # one stream driver per checkpoint, never two at once
    stream = workloads["threes-stream"]
    assert stream["spec"]["replicas"] == 1 and stream["spec"]["strategy"]["type"] == "Recreate"
    for workload in workloads.values():
        selector = workload["spec"].get("selector", {}).get("matchLabels", {})
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()


def test_the_stream_job_checkpoints_on_object_storage(manifests: list[dict[str, Any]]) -> None:
    stream = _workloads(manifests)["threes-stream"]
    container = _container(stream)
    env = _environment(manifests, container)
    pipeline = load_pipeline(EXAMPLE, environ=env)
    location = pipeline.stream.checkpoint_location
    assert location.startswith("s3a://"), location
    # the bucket is one the pipeline creates (load-reference and the archive sink write to it)
    bucket = location.removeprefix("s3a://").split("/")[0]
    assert bucket in {s.bucket for svc in pipeline.sync for s in svc.sinks if hasattr(s, "bucket")}
    # S3A reads its endpoint from the mounted spark-defaults.conf and its keys from the AWS chain
    conf_dir = env["SPARK_CONF_DIR"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == conf_dir)
    volume = next(v for v in stream["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    defaults = _by_kind(manifests, "ConfigMap")[volume["configMap"]["name"]]["data"]["spark-defaults.conf"]
    settings = dict(line.split(None, 1) for line in defaults.splitlines() if line.strip())
    assert settings["spark.hadoop.fs.s3a.endpoint"] == env["THREES_S3_ENDPOINT_URL"]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(env)


def test_secrets_come_from_the_secret_only(manifests: list[dict[str, Any]]) -> None:
    secret = _by_kind(manifests, "Secret")["threes-credentials"]
    values = [v for k, v in secret["stringData"].items() if "SECRET" in k or "URL" in k]
    values.append(_by_kind(manifests, "Secret")[METRICS_TOKEN_SECRET]["stringData"]["THREES_METRICS_TOKEN"])
    # the example YAML keeps the local stack's defaults (${env:THREES_S3_SECRET_ACCESS_KEY:-...}): the
    # Secret sets every variable that carries a secret, so those defaults never apply here
    for variable in ("THREES_POSTGRES_URL", "THREES_S3_SECRET_ACCESS_KEY"):
        assert f"${{env:{variable}" in EXAMPLE.read_text() and variable in secret["stringData"]
    others = [m for m in manifests if m["kind"] != "Secret" and m["metadata"]["name"] != "threes-pipeline"]
    everything_else = yaml.safe_dump_all(others)
    for value in values:
        assert value not in everything_else
    for name, workload in _workloads(manifests).items():
        container = _container(workload)
        assert {"secretRef": {"name": secret["metadata"]["name"]}} in container["envFrom"], name


def test_pods_meet_the_restricted_pod_security_standard(manifests: list[dict[str, Any]]) -> None:
    namespace = _by_kind(manifests, "Namespace")["threes"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, workload in _workloads(manifests).items():
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        container = _container(workload)
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        assert "memory" in container["resources"]["limits"], name
