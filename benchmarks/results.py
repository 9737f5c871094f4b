"""The benchmarks' figures in one place: ``results.jsonl`` (every recorded run) and ``RESULTS.md`` (the latest).

Every benchmark prints its figures as one JSON object on its last line. ``record`` appends that line to
``benchmarks/results.jsonl`` with the date, the commit and the machine; ``render`` writes
``benchmarks/RESULTS.md`` with the latest line of each benchmark. The docs link to RESULTS.md instead of
quoting figures, so a figure has one home and says when, at which commit and on what it was measured.

Usage::

    .venv/bin/python benchmarks/stream_join.py | tee /tmp/out && \\
        .venv/bin/python benchmarks/results.py record stream_join < /tmp/out
    .venv/bin/python benchmarks/results.py render

A line of results.jsonl::

    {"benchmark": "stream_join", "date": "2026-11-28", "commit": "612e38c", "machine": "...",
     "source": "run" | "docs", "figures": {...}, "note": "...", "load_average": [1.2, 1.5, 1.4],
     "rerun": "..."}

``source: docs`` marks a figure taken from the documentation of that date (no JSON line of the run was kept);
its ``rerun`` says which run would replace it. ``load_average`` (1, 5 and 15 minutes, when ``record`` ran,
right after the benchmark) is on the lines recorded since it was added. RESULTS.md shows the recorded runs
first, then the figures from the docs under one heading, "Historical figures (not re-run)".
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.jsonl"
RENDERED = HERE / "RESULTS.md"


def last_json_line(text: str) -> dict[str, Any]:
    """The last line of a benchmark's output that is a JSON object.

    Raises:
        ValueError: no line is a JSON object.
    """
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    raise ValueError("no line of the output is a JSON object: did the benchmark finish?")


def machine() -> str:
    """A short description of this machine: host, CPUs, memory, Python."""
    mem = ""
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        kib = int(next(ln for ln in meminfo if ln.startswith("MemTotal")).split()[1])
        mem = f", {kib / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{platform.node()}: {os.cpu_count()} CPUs{mem}, Python {platform.python_version()}"


def commit(cwd: Path = HERE) -> str:
    """The short commit of the checkout, with ``+dirty`` when it has uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record(benchmark: str, output: str, results: Path = RESULTS, note: str | None = None,
           now: dt.datetime | None = None) -> dict[str, Any]:
    """Append one run's figures (the output's last JSON line) to ``results``.

    The line also holds the machine's load average (1, 5 and 15 minutes) when ``record`` runs: right after the
    benchmark when its output is piped in, so a reader sees how busy the shared machine was.

    Args:
        benchmark: the benchmark's name (its module's, e.g. ``stream_join``).
        output: what the benchmark printed; its last JSON object line holds the figures.
        results: the JSON Lines file.
        note: what a reader needs to compare the figure (the load on the machine, a setting).
        now: the run's time (default: now, UTC).

    Returns:
        The appended line.

    Raises:
        ValueError: the output holds no JSON object line.
    """
    figures = last_json_line(output)
    entry: dict[str, Any] = {
        "benchmark": benchmark,
        "date": (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%d"),
        "commit": commit(),
        "machine": machine(),
        "source": "run",
        "figures": figures,
    }
    if note:
        entry["note"] = note
    try:
        entry["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        pass
    with results.open("a") as f:
        f.write(json.dumps(entry, separators=(", ", ": ")) + "\n")
    return entry


def latest(results: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """The latest line per benchmark: the newest date, and on the same date the later line of the file."""
    out: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(results.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{results}:{n}: not JSON: {exc}") from exc
        name = entry["benchmark"]
        if name not in out or entry["date"] >= out[name]["date"]:
            out[name] = entry
    return out


def _flat(figures: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in figures.items():
        if isinstance(value, dict):
            rows.extend(_flat(value, f"{prefix}{key}."))
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


def _anchor(name: str) -> str:
    # GitHub's heading anchors: lower case, punctuation other than - and _ dropped, spaces to -
    return re.sub(r"[^\w\- ]", "", name.lower()).replace(" ", "-")


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value).replace("|", "\\|")


HISTORICAL = "Historical figures (not re-run)"


_NOTE_LOAD = re.compile(r"\bload (?:average )?(?:was )?((?:under |~)?\d[\d.]*(?:[-/]\d[\d.]*)*)")


def _load(e: dict[str, Any]) -> str:
    """The load average of a run: recorded with it (1 min), else among its figures, else as its note states it."""
    if e.get("load_average"):
        return _cell(e["load_average"][0])
    load = dict(_flat(e["figures"])).get("load_average_1m")
    if load is not None:
        return _cell(load)
    stated = _NOTE_LOAD.search(e.get("note", ""))
    return f"{stated.group(1)} (note)" if stated else "not recorded"


def _section(e: dict[str, Any], level: str) -> list[str]:
    """One benchmark's heading, provenance, note and figures table."""
    load = f", load average {', '.join(_cell(x) for x in e['load_average'])} (1, 5, 15 min)" \
        if e.get("load_average") else ""
    lines = ["", f"{level} {e['benchmark']}", "", f"{e['date']}, commit `{e['commit']}`, {e['machine']}{load}."]
    if e.get("source") != "run":
        lines.append(f"Figure from the docs of {e['date']} (no JSON line of the run was kept).")
        lines += ["", f"Re-run that would replace it: {e.get('rerun') or 'not stated.'}"]
    if e.get("note"):
        lines += ["", e["note"]]
    lines += ["", "| figure | value |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in _flat(e["figures"])]
    return lines


def render(results: Path = RESULTS, output: Path = RENDERED) -> str:
    """Write the Markdown page of the latest figure per benchmark; return its text.

    The benchmarks with a recorded run (``source: run``) come first, by name; the figures quoted from the
    docs (``source: docs``) follow under one heading, "Historical figures (not re-run)", by name, each with
    the run that would replace it.
    """
    entries = latest(results)
    runs = [entries[n] for n in sorted(entries) if entries[n].get("source") == "run"]
    docs = [entries[n] for n in sorted(entries) if entries[n].get("source") != "run"]
    lines = [
        "# Benchmark results",
        "",
        "Generated by `benchmarks/results.py render` from `benchmarks/results.jsonl`: the latest figures of each",
        "benchmark, with the date, the commit and the machine they were measured on. Do not edit by hand: run a",
        "benchmark, `benchmarks/results.py record NAME < its output`, then `render`. A ratio is the threes figure",
        "over its peer's (higher is better for rates) measured in the same run.",
        "",
        "Recorded runs: the benchmark's own JSON line, recorded by `benchmarks/results.py record`.",
        "",
        "| benchmark | date | commit | load average |",
        "|---|---|---|---|",
    ]
    lines += [f"| [{e['benchmark']}](#{_anchor(e['benchmark'])}) | {e['date']} | `{e['commit']}` | {_load(e)} |"
              for e in runs]
    if docs:
        lines += ["", f"{len(docs)} more figures are quoted from the docs, not recorded runs: see",
                  f"[{HISTORICAL}](#{_anchor(HISTORICAL)}) at the end."]
    for e in runs:
        lines += _section(e, "##")
    if docs:
        lines += [
            "", f"## {HISTORICAL}", "",
            "These figures were not recorded by `benchmarks/results.py`: each is quoted from the docs of its date",
            "at the commit shown (mostly the commit that wrote the figure) and no JSON line of its run was kept. They",
            "stay here as history; each says which re-run would replace it with a recorded one.",
            "",
            "| figure | docs of | commit |",
            "|---|---|---|",
        ]
        lines += [f"| [{e['benchmark']}](#{_anchor(e['benchmark'])}) | {e['date']} | `{e['commit']}` |" for e in docs]
        for e in docs:
            lines += _section(e, "###")
    text = "\n".join(lines) + "\n"
    output.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Command line: ``record NAME [--note TEXT] < output`` or ``render``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="append a benchmark's last JSON line (read from stdin) to results.jsonl")
    rec.add_argument("benchmark")
    rec.add_argument("--note")
    sub.add_parser("render", help="write RESULTS.md with the latest line per benchmark")
    args = parser.parse_args(argv)
    try:
        if args.command == "record":
            entry = record(args.benchmark, sys.stdin.read(), note=args.note)
            print(f"recorded {entry['benchmark']} at {entry['commit']} in {RESULTS}")
        else:
            render()
            print(f"wrote {RENDERED}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
