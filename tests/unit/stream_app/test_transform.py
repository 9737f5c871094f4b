"""``stream.transform``: the reference is imported at validate time; its errors name the key, never a traceback."""

from __future__ import annotations

import json
import sys
import uuid

import pytest
from typer.testing import CliRunner

from kernel.exceptions import ConfigError
from stream_app.plan import build_plan
from threes.cli import app

from .test_plan import FLIGHT, config

PIPELINE = """\
version: 1
kafka:
  bootstrap_servers: 127.0.0.1:19092
stream:
  events: {topic: flights, value_schema: flight.avsc}
  transform: TRANSFORM
  enriched_topic: flights.enriched
  dead_letter_topic: flights.dlq
  updates:
    - {topic: updates.flights, kind: projection, key: [flight_id], fields: [flight_id, delay_class]}
  checkpoint_location: cp
"""


@pytest.fixture(autouse=True)
def _own_sys_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # a module next to the config adds its folder


def _module(tmp_path, body):
    name = f"tx_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(body)
    return name


def _validate(tmp_path, transform, pipeline=PIPELINE):
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    path = tmp_path / "pipeline.yaml"
    path.write_text(pipeline.replace("TRANSFORM", transform))
    return path, CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})


def test_a_module_that_does_not_exist_is_a_config_error_at_stream_transform(tmp_path):
    path, result = _validate(tmp_path, "nosuch.module:fn")
    assert result.exit_code == 1
    assert (f"{path}:6: stream.transform: cannot import module 'nosuch.module': no module named 'nosuch' on the "
            f"Python path, nor in {tmp_path}") in result.output
    assert "Traceback" not in result.output
    with pytest.raises(ConfigError, match=r"stream\.transform: cannot import module 'nosuch\.module'"):
        build_plan(config(tmp_path, transform="nosuch.module:fn"), None, tmp_path)


def test_a_missing_function_a_failing_import_and_a_non_function_are_config_errors(tmp_path):
    good = _module(tmp_path, "def add(df):\n    return df\nLIMIT = 3\n")
    failing = _module(tmp_path, "raise RuntimeError('no credentials here\\nsecond line')\n")
    cases = {
        f"{good}:nope": f"stream.transform: module '{good}' has no function 'nope'",
        f"{good}:LIMIT": f"stream.transform: '{good}:LIMIT' is a int, not a function DataFrame -> DataFrame",
        f"{failing}:fn": f"stream.transform: importing module '{failing}' failed: RuntimeError: no credentials here",
    }
    for ref, message in cases.items():
        with pytest.raises(ConfigError) as info:
            build_plan(config(tmp_path, transform=ref), None, tmp_path)
        assert [str(p) for p in info.value.problems] == [f"<config>: {message}"]


def test_a_reference_without_a_function_is_refused_by_the_config_model(tmp_path):
    path, result = _validate(tmp_path, "just_a_module")
    assert result.exit_code == 1
    assert f"{path}:6: stream.transform:" in result.output and "Traceback" not in result.output


def test_validate_accepts_columns_the_transform_adds_and_says_they_are_checked_at_start_up(tmp_path):
    name = _module(tmp_path, "def classify(df):\n    return df\n")
    path, result = _validate(tmp_path, f"{name}:classify")
    assert result.exit_code == 0, result.output  # delay_class: made by the function, known when Spark runs it
    assert f"note: stream.transform ({name}:classify): the columns it adds or drops" in result.output
    # without Spark there is no plan (its output is unknown); the event side is still checked
    assert build_plan(config(tmp_path, transform=f"{name}:classify"), None, tmp_path) is None
    bad = PIPELINE.replace("kind: projection, key: [flight_id]", "kind: projection, key: [flight_id], "
                           "where: \"carrier > 1 and\"")
    _, result = _validate(tmp_path, f"{name}:classify", bad)
    assert result.exit_code == 1 and "stream.updates[0].where" in result.output
