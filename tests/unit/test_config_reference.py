"""docs/config-reference.md is generated from the config models and must be current."""

from __future__ import annotations

import re
from pathlib import Path

from connectors import registry
from kernel.config.models import KafkaConfig
from stream_app.config import StreamJobConfig
from sync_service.config import SyncServiceBase
from threes.demo.config_docs import render, sections

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "config-reference.md"


def test_committed_reference_is_current() -> None:
    assert REFERENCE.read_text() == render(), (
        "docs/config-reference.md is out of date with the config models: "
        "run `threes docs -o docs/config-reference.md` and commit it"
    )


def _rows(text: str, heading: str) -> set[str]:
    """The keys listed in the table under one section heading."""
    block = text.split(f"## `{heading}`\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", block, re.M))


def test_every_key_of_every_registered_connector_is_documented() -> None:
    text = render()
    for key, model in registry.config_models().items():
        heading = f"sources[] (type: {key})" if model.role == "source" else f"sync[].sinks[] (type: {key})"
        assert _rows(text, heading) == set(model.model_fields), key


def test_nested_models_are_documented_once_with_all_their_keys() -> None:
    text = render()
    assert _rows(text, "kafka") == set(KafkaConfig.model_fields)
    assert _rows(text, "stream") == set(StreamJobConfig.model_fields)
    assert set(SyncServiceBase.model_fields) | {"sinks"} == _rows(text, "sync[]")
    paths = [s.path for s in sections()]
    assert len(paths) == len(set(paths))
    for path in ("stream.events", "stream.snapshots[]", "stream.lookups[]", "stream.updates[]", "stream.spark",
                 "sources[].topic_spec", "sync[].batch", "sync[].retry"):
        assert path in paths
    # every link points at a section that exists
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', text))
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in anchors, target


def test_defaults_constraints_and_descriptions_come_from_the_models() -> None:
    text = render()
    assert "| `request_timeout_s` | number (> 0) | `10.0` | timeout of admin/metadata calls |" in text
    assert "| `bootstrap_servers` | string | **required** |" in text
    assert "| `max_bytes` | integer (≥ 1) | `16_777_216` |" in text
    assert "secret string" in text  # sasl_password, passwords, keys
