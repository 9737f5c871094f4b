"""A copy of a pipeline YAML whose every topic, table, index, prefix and group carries a suffix.

Tests (and parallel demo runs) need their own topics and sinks: this rewrites
the YAML document, before validation, so every name the pipeline owns is
unique to one run while the connections, schemas and everything else stay
as written:

* topics: ``state.airports`` -> ``state.airports.<suffix>`` (every topic key:
  sources, the stream job's events, snapshots, enriched, dead letter and
  update topics, the sinks' topics and dead letter topics);
* the tables sources read keep their names in a database schema of their own
  (``threes_<suffix>.airports``): RdsSource names its Avro records after the
  table (``threes.rds.airports``), which the reader schemas list as aliases;
* indices and the sinks' tables: ``flights`` -> ``flights_<suffix>``;
* S3 prefixes: ``archive/`` -> ``<suffix>/archive/`` (buckets are kept: creating
  one per test would be slow on some servers);
* the stream job's checkpoint folder, its name, the sync services' consumer
  groups; metrics ports get the numbers ``port()`` hands out, or are removed
  (two runs cannot share a port).
"""

from __future__ import annotations

import copy
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

_SUFFIX = re.compile(r"^[a-z0-9]{1,16}$")


def _topic(name: str, suffix: str) -> str:
    return f"{name}.{suffix}"


def _name(name: str, suffix: str) -> str:
    return f"{name}_{suffix}"


def database_schema(suffix: str) -> str:
    """The database schema holding an isolated run's reference tables."""
    return f"threes_{suffix}"


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's choice for an ephemeral bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port(section: dict[str, Any], port: Callable[[], int] | None) -> None:
    if "metrics_port" not in section:
        return
    if port is None:
        section.pop("metrics_port")
    else:
        section["metrics_port"] = port()


def isolate(document: dict[str, Any], suffix: str, port: Callable[[], int] | None = None) -> dict[str, Any]:
    """Rewrite a pipeline document (parsed YAML, not validated) with unique names.

    Args:
        document: the parsed YAML of a pipeline.
        suffix: lowercase letters and digits, at most 16.
        port: gives a metrics port for each one the document declares (e.g.
            :func:`free_port`); ``None`` removes them.

    Returns:
        A new document; ``document`` is not changed.

    Raises:
        ValueError: a bad suffix.
    """
    if not _SUFFIX.match(suffix):
        raise ValueError(f"suffix {suffix!r}: use 1-16 lowercase letters and digits")
    doc = copy.deepcopy(document)
    for source in doc.get("sources") or []:
        source["topic"] = _topic(source["topic"], suffix)
        if source.get("type") == "rds_source":
            source["schema_name"] = database_schema(suffix)
        if "index" in source:
            source["index"] = _name(source["index"], suffix)
        if "prefix" in source:
            source["prefix"] = f"{suffix}/{source['prefix']}"
    stream = doc.get("stream")
    if stream:
        stream["name"] = _name(stream.get("name", "stream"), suffix)
        stream["events"]["topic"] = _topic(stream["events"]["topic"], suffix)
        for snap in stream.get("snapshots") or []:
            snap["topics"] = [_topic(t, suffix) for t in snap["topics"]]
        for key in ("enriched_topic", "dead_letter_topic"):
            stream[key] = _topic(stream[key], suffix)
        for update in stream.get("updates") or []:
            update["topic"] = _topic(update["topic"], suffix)
        stream["checkpoint_location"] = f"{stream['checkpoint_location'].rstrip('/')}-{suffix}"
        _port(stream, port)
    for service in doc.get("sync") or []:
        service["group_id"] = f"{service.get('group_id') or 'threes-sync-' + service['name']}-{suffix}"
        service["dead_letter_topic"] = _topic(service["dead_letter_topic"], suffix)
        _port(service, port)
        for sink in service.get("sinks") or []:
            sink["topics"] = [_topic(t, suffix) for t in sink["topics"]]
            for key in ("table", "index"):
                if key in sink:
                    sink[key] = _name(sink[key], suffix)
            if "prefix" in sink:
                sink["prefix"] = f"{suffix}/{sink['prefix']}"
    return doc


def realtime_variant(document: dict[str, Any], checkpoint_interval: str = "5 seconds") -> dict[str, Any]:
    """Rewrite a pipeline document (parsed YAML, not validated) to run its stream job in real-time mode.

    Real-time mode cannot run aggregations nor bound micro-batches (``threes validate`` refuses
    both, see :func:`stream_app.realtime.realtime_problems`), so the copy keeps only the stream's
    projection updates, drops ``events.max_offsets_per_trigger``, and removes the update topics no longer
    written from the sinks' topics, then every sink left without a topic (in the example: the
    ``route_stats`` table) and every sync service left without a sink. Everything else stays as written.

    Args:
        document: the parsed YAML of a pipeline with a ``stream`` section.
        checkpoint_interval: the real-time query's checkpoint interval (at least 5 seconds).

    Returns:
        A new document; ``document`` is not changed.

    Raises:
        ValueError: the document has no stream job, or no projection update is left.
    """
    doc = copy.deepcopy(document)
    stream = doc.get("stream")
    if not stream:
        raise ValueError("the pipeline has no stream job to run in real-time mode")
    stream["mode"] = "realtime"
    stream["checkpoint_interval"] = checkpoint_interval
    stream["events"].pop("max_offsets_per_trigger", None)
    updates = stream.get("updates") or []
    dropped = {u["topic"] for u in updates if u.get("kind") == "aggregation"}
    stream["updates"] = [u for u in updates if u["topic"] not in dropped]
    if not stream["updates"]:
        raise ValueError("no projection update is left to run in real-time mode")
    services = []
    for service in doc.get("sync") or []:
        for sink in service.get("sinks") or []:
            sink["topics"] = [t for t in sink["topics"] if t not in dropped]
        service["sinks"] = [s for s in service.get("sinks") or [] if s["topics"]]
        if service["sinks"]:
            services.append(service)
    doc["sync"] = services
    return doc


def write_isolated(
    source: str | Path, target: str | Path, suffix: str, port: Callable[[], int] | None = None
) -> Path:
    """Write an isolated copy of the pipeline YAML ``source`` to ``target`` (see :func:`isolate`).

    Relative schema paths keep working only for shipped schema names; the
    example YAML uses those.

    Returns:
        ``target`` as a :class:`~pathlib.Path`.
    """
    from kernel.config.loader import _Yaml12BoolLoader

    document = yaml.load(Path(source).read_text(), Loader=_Yaml12BoolLoader)  # a SafeLoader subclass
    target = Path(target)
    target.write_text(yaml.safe_dump(isolate(document, suffix, port), sort_keys=False))
    return target
