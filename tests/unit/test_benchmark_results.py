"""benchmarks/results.py: a run's last JSON line is recorded, and RESULTS.md shows the latest per benchmark."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_results", ROOT / "benchmarks" / "results.py")
results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(results)


def test_record_keeps_the_last_json_line_and_render_shows_the_latest_per_benchmark(tmp_path: Path) -> None:
    jsonl, md = tmp_path / "results.jsonl", tmp_path / "RESULTS.md"
    jsonl.write_text(json.dumps({"benchmark": "old_one", "date": "2026-01-01", "commit": "abc1234",
                                 "machine": "m", "source": "docs", "figures": {"rate": 10}}) + "\n")
    day1, day2 = dt.datetime(2026, 2, 1, tzinfo=dt.UTC), dt.datetime(2026, 2, 2, tzinfo=dt.UTC)
    results.record("join", 'progress\n{"ratio": 0.5}\n{"ratio": 0.7, "rate": 1234}\ndone\n', jsonl, now=day1)
    results.record("join", '{"ratio": 0.9, "nested": {"p99_s": 1.5}}', jsonl, note="a quiet day", now=day2)
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert [x["figures"] for x in lines[1:]] == [{"ratio": 0.7, "rate": 1234}, {"ratio": 0.9, "nested": {"p99_s": 1.5}}]
    assert lines[1]["date"] == "2026-02-01" and lines[1]["source"] == "run" and lines[1]["commit"]

    text = results.render(jsonl, md)
    assert md.read_text() == text
    assert "| nested.p99_s | 1.5 |" in text and "a quiet day" in text
    assert "| ratio | 0.7 |" not in text  # only the latest line of `join`
    assert "figure from the docs of 2026-01-01" in text and "| rate | 10 |" in text


def test_an_output_without_json_is_refused(tmp_path: Path) -> None:
    jsonl = tmp_path / "results.jsonl"
    try:
        results.record("join", "Traceback ...\nKeyError\n", jsonl)
    except ValueError as exc:
        assert "no line" in str(exc)
    else:
        raise AssertionError("recorded an output without figures")
    assert not jsonl.exists()


def test_the_committed_results_page_is_current(tmp_path: Path) -> None:
    # RESULTS.md is generated: a hand edit or a forgotten `render` shows here
    assert results.render(ROOT / "benchmarks" / "results.jsonl", tmp_path / "R.md") == (
        ROOT / "benchmarks" / "RESULTS.md").read_text()
