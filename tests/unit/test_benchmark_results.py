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
                                 "machine": "m", "source": "docs", "figures": {"rate": 10},
                                 "rerun": "`python benchmarks/old_one.py`"}) + "\n")
    day1, day2 = dt.datetime(2026, 2, 1, tzinfo=dt.UTC), dt.datetime(2026, 2, 2, tzinfo=dt.UTC)
    results.record("join", 'progress\n{"ratio": 0.5}\n{"ratio": 0.7, "rate": 1234}\ndone\n', jsonl, now=day1)
    results.record("join", '{"ratio": 0.9, "nested": {"p99_s": 1.5}}', jsonl, note="a quiet day", now=day2)
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert [x["figures"] for x in lines[1:]] == [{"ratio": 0.7, "rate": 1234}, {"ratio": 0.9, "nested": {"p99_s": 1.5}}]
    assert lines[1]["date"] == "2026-02-01" and lines[1]["source"] == "run" and lines[1]["commit"]
    assert len(lines[1]["load_average"]) == 3

    text = results.render(jsonl, md)
    assert md.read_text() == text
    assert "| nested.p99_s | 1.5 |" in text and "a quiet day" in text
    assert "| ratio | 0.7 |" not in text  # only the latest line of `join`
    assert "Figure from the docs of 2026-01-01" in text and "| rate | 10 |" in text


def test_recorded_runs_come_first_and_figures_from_the_docs_last_under_one_heading(tmp_path: Path) -> None:
    jsonl, md = tmp_path / "results.jsonl", tmp_path / "RESULTS.md"
    docs = {"machine": "m", "source": "docs", "figures": {"rate": 10}}
    jsonl.write_text("\n".join(json.dumps(x) for x in [
        {"benchmark": "a_docs", "date": "2026-01-01", "commit": "a", **docs, "rerun": "`python benchmarks/a.py`"},
        {"benchmark": "z_run", "date": "2026-01-02", "commit": "z", "machine": "m", "source": "run",
         "figures": {"ratio": 0.9}, "note": "at load 3-4"},
        {"benchmark": "m_docs", "date": "2026-01-01", "commit": "m", **docs},
        {"benchmark": "b_run", "date": "2026-01-02", "commit": "b", "machine": "m", "source": "run",
         "figures": {"ratio": 1.1}, "load_average": [2.5, 2.0, 1.5]},
    ]) + "\n")
    text = results.render(jsonl, md)
    headings = [x for x in text.splitlines() if x.startswith("#")]
    assert headings == ["# Benchmark results", "## b_run", "## z_run", "## Historical figures (not re-run)",
                        "### a_docs", "### m_docs"]
    assert text.count("## Historical figures") == 1
    historical = text.split("## Historical figures (not re-run)")[1]
    assert "not recorded by `benchmarks/results.py`" in historical
    assert "Re-run that would replace it: `python benchmarks/a.py`" in historical
    assert "Re-run that would replace it: not stated." in historical  # m_docs names none
    assert "| [b_run](#b_run) | 2026-01-02 | `b` | 2.5 |" in text  # the recorded load average
    assert "| [z_run](#z_run) | 2026-01-02 | `z` | 3-4 (note) |" in text  # as the note states it
    assert "2026-01-02, commit `b`, m, load average 2.5, 2, 1.5 (1, 5, 15 min)." in text


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
