"""Aggregation specs cut at a comma by a YAML flow mapping are named as such; the docs quote them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kernel.exceptions import ConfigError
from stream_app.aggregation_specs import parse_aggregation
from threes.config import load_pipeline

README = Path(__file__).parents[3] / "stream_app" / "README.md"

PIPELINE = """\
version: 1
kafka:
  bootstrap_servers: 127.0.0.1:19092
stream:
  name: j
  events: {topic: ev, value_schema: nycflights13/flight}
  enriched_topic: en
  dead_letter_topic: dl
  checkpoint_location: cp
  updates:
    - {topic: stats, kind: aggregation, group_by: [origin], event_time: time_hour, window: 1 hour,
       aggregations: {flights: count, p95: SPEC}}
"""


def test_every_aggregation_of_the_readme_examples_parses() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)
    specs = []
    for block in blocks:
        doc = yaml.safe_load(block) or {}
        for update in (doc.get("stream") or {}).get("updates") or []:
            specs += list((update.get("aggregations") or {}).items())
    assert specs, "the README has no aggregation example"
    for name, spec in specs:
        assert isinstance(spec, str), f"{name}: {spec!r} (an unquoted spec with a comma in a flow mapping?)"
        parse_aggregation(spec)


def test_an_unquoted_percentile_in_a_flow_mapping_is_said_to_be_cut_at_a_comma(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE.replace("SPEC", "percentile(dep_delay, 0.95)"))
    with pytest.raises(ConfigError) as err:
        load_pipeline(path, environ={})
    (problem,) = err.value.problems
    assert problem.line == 12 and "cut at a comma" in problem.message and "quote" in problem.message
    path.write_text(PIPELINE.replace("SPEC", '"percentile(dep_delay, 0.95)"'))
    assert load_pipeline(path, environ={}).stream.updates[0].aggregations["p95"] == "percentile(dep_delay, 0.95)"


def test_a_spec_with_an_open_parenthesis_names_the_cut() -> None:
    with pytest.raises(ValueError, match="looks cut at a comma"):
        parse_aggregation("percentile(dep_delay")
