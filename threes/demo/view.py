"""The demo's rich live view and its final summary table."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from threes.demo.run import LiveState


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _bar(done: int, total: int, width: int = 24) -> str:
    if total <= 0:
        return ""
    filled = min(width, int(width * done / total))
    return "█" * filled + "░" * (width - filled) + f" {100 * min(done, total) / total:5.1f}%"


def live(state: LiveState) -> Panel:
    """The live view of a run: events in, enriched out, per-sink counts, lag, the reference changes."""
    now = time.time()
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column()
    p = state.progress
    total = state.total
    if state.phase == "start" or (p is None and state.state_topics):
        for topic, count in sorted(state.state_topics.items()):
            table.add_row(f"state topic {topic}", _n(count), "")
    if p is not None:
        table.add_row(
            "events in (replayed)", _n(state.events_in), _bar(state.events_in, total) + f"  {state.replay_rate:,.0f}/s"
        )
        table.add_row("enriched out", _n(p.enriched_out), _bar(p.enriched_out, total))
        table.add_row("Elasticsearch docs", _n(p.es_docs), _bar(p.es_docs, total))
        if p.pg_flights is not None:  # None: the pipeline has no route_stats sink
            table.add_row(
                "PostgreSQL route_stats",
                _n(p.pg_rows),
                f"rows; flights counted {_n(p.pg_flights)} " + _bar(p.pg_flights, total, 12),
            )
        table.add_row("S3 archive objects", _n(p.s3_objects), "")
        for name, committed in sorted(p.committed.items()):
            table.add_row(f"sync {name}", _n(committed), f"committed, lag {_n(p.lag.get(name, 0))}")
        if p.dead_letters:
            table.add_row("dead letters", _n(p.dead_letters), "")
    for change in state.changes:
        if change.applied_at is None:
            status = f"at {change.at_fraction:.0%} of the flights"
        else:
            status = f"applied {now - change.applied_at:4.0f} s ago"
            if change.state_at:
                status += f"; state topic +{change.state_at - change.applied_at:.1f} s"
            if change.sink_at:
                status += f"; in Elasticsearch +{change.sink_at - change.applied_at:.1f} s"
        table.add_row(Text(change.label, style="cyan"), "", status)
    for sink, lat in state.latencies.items():
        if lat.get("samples"):
            table.add_row(
                f"latency {sink}",
                f"p50 {lat['p50_s']:.1f} s",
                f"p99 {lat['p99_s']:.1f} s ({lat['samples']}/{lat['of']} samples)",
            )
    cpu = state.cpu
    if cpu.get("components_s"):
        top = sorted(((v, k) for k, v in cpu["components_s"].items() if v), reverse=True)[:4]
        table.add_row(
            "CPU so far",
            f"{cpu['pipeline_s']:,.0f} s",
            f"{cpu.get('pipeline_cores') or 0:.2f} cores; " + ", ".join(f"{k} {v:,.0f}" for v, k in top),
        )
    elapsed = now - (state.first_event_at or state.phase_started)
    title = f"threes demo · {state.phase} · {elapsed:5.0f} s"
    body: list[Any] = [table]
    if state.message:
        body.append(Text(state.message, style="dim"))
    return Panel(Group(*body), title=title, border_style="blue")


def summary_table(summary: dict[str, Any]) -> Group:
    """The end-of-run summary for people (the JSON line carries the same data)."""
    phases = Table("phase", "wall time", title="phases")
    for name, seconds in summary.get("phases_s", {}).items():
        phases.add_row(name, f"{seconds:.1f} s")

    main = Table("", "", title=f"nycflights13: {summary.get('flights', 0):,} flights")
    main.add_row("events in", _n(summary.get("events_in")))
    main.add_row("enriched out", _n(summary.get("enriched_out")))
    main.add_row("dead letters", _n(summary.get("dead_letters")))
    target = summary.get("first_flight_to_all_sinks_s")
    if target is not None:
        met = "[green]met[/green]" if summary.get("target_met") else "[red]missed[/red]"
        main.add_row("first flight → all sinks", f"{target:.1f} s (target {summary['target_s']:.0f} s: {met})")
        main.add_row("throughput", f"{summary['throughput_events_per_s']:,} flights/s")
        for sink, seconds in summary.get("first_flight_to_sink_complete_s", {}).items():
            main.add_row(f"  {sink} complete", f"{seconds:.1f} s")
    sinks = summary.get("sinks", {})
    if sinks:
        es, pg, s3 = sinks["elasticsearch"], sinks.get("postgres"), sinks["s3"]
        main.add_row(f"Elasticsearch {es['index']}", f"{es['docs']:,} docs")
        if pg is not None:
            main.add_row(f"PostgreSQL {pg['table']}", f"{pg['rows']:,} rows ({pg['flights']:,} flights)")
        main.add_row(f"S3 {s3['bucket']}/{s3['prefix']}", f"{s3['objects']:,} objects, {s3['rows']:,} rows")
    for sink, lat in summary.get("latency_s", {}).items():
        if lat.get("samples"):
            main.add_row(f"latency → {sink}", f"p50 {lat['p50_s']:.1f} s, p99 {lat['p99_s']:.1f} s")

    cpu = cpu_table(summary.get("cpu") or {})

    checks = _oracle_table(summary.get("oracle", {}))
    return Group(*(t for t in (phases, main, cpu, checks) if t is not None))


def _oracle_table(oracle: dict[str, Any]) -> Table:
    """The summary's checks against the oracle: match rates, each sink, each reference change, the verdict."""
    checks = Table("check", "result", title="oracle (pandas, from the CSV files)")
    rates = oracle.get("match_rate", {})
    expected = oracle.get("expected_match_rate", {})
    for name, got in rates.items():
        want = expected.get(name, {})
        ok = got.get("matched") == want.get("matched")
        text = f"{got['rate']:.2%} ({got['matched']:,}; expected {want.get('matched', 0):,})"
        checks.add_row(f"match rate {name}", text + ("" if ok else " [red]differs[/red]"))
    for key in ("flights_index", "route_stats", "archive"):
        if key in oracle:
            r = oracle[key]
            if r.get("skipped"):
                checks.add_row(key.replace("_", " "), f"[yellow]skipped[/yellow]: {r['skipped']}")
                continue
            verdict = "[green]match[/green]" if r.get("ok") else "[red]MISMATCH[/red]"
            checks.add_row(
                key.replace("_", " "),
                f"{verdict} {r.get('actual_rows', 0):,}/{r.get('expected_rows', 0):,}"
                + (f" {r['examples'][:2]}" if not r.get("ok") and r.get("examples") else ""),
            )
    for change in oracle.get("reference_changes", []):
        ok = "[green]clean switch[/green]" if change.get("boundary_ok") else "[red]NOT clean[/red]"
        checks.add_row(
            change["change"],
            f"state topic +{change.get('to_state_topic_s')} s, Elasticsearch "
            f"+{change.get('to_elasticsearch_s')} s; {change.get('flights_with_new_value', 0):,} of "
            f"{change.get('flights_affected', 0):,} flights carry the new value; {ok}",
        )
    if oracle:
        verdict = "[green]yes[/green]" if oracle.get("all_match") else "[red]NO[/red]"
        skipped = sorted(oracle.get("skipped") or {})
        checks.add_row("full output matches the oracle", verdict + (f" (skipped: {', '.join(skipped)})" if skipped
                                                                    else ""))
    return checks


COMPONENT_TITLES = {
    "stream": "stream job (driver, Spark JVM, Python workers)",
    "demo": "threes demo (replay, watcher)",
    "s3": "S3 server (s3proxy)",
    "postgres": "PostgreSQL (all backends)",
    "spark-master": "Spark master",
}


def component_title(name: str) -> str:
    """How the summary names a component (a Spark worker runs the stream job's executors on a cluster)."""
    if name.startswith("spark-worker"):
        return f"Spark {name.removeprefix('spark-')} (stream job's executors)"
    return COMPONENT_TITLES.get(name, name)


def cpu_table(cpu: dict[str, Any]) -> Table | None:
    """CPU seconds per component over the pipeline phase (``None`` when not measured)."""
    components = cpu.get("components_s") or {}
    if not components:
        return None
    total = cpu.get("pipeline_s") or 0.0
    table = Table(
        "component",
        "CPU s",
        "share",
        "processes (CPU s)",
        title=f"CPU over the pipeline phase ({cpu.get('window_s', 0):.1f} s)",
    )
    for name, seconds in sorted(components.items(), key=lambda kv: -(kv[1] or 0)):
        procs = cpu.get("processes_s", {}).get(name, {})
        detail = ", ".join(f"{comm} {s:,.1f}" for comm, s in procs.items()) if len(procs) > 1 else ""
        if seconds is None:
            table.add_row(component_title(name), "-", "", "not running")
            continue
        share = f"{seconds / total:.0%}" if total else ""
        table.add_row(component_title(name), f"{seconds:,.1f}", share, detail)
    table.add_row(
        "[bold]pipeline[/bold]",
        f"[bold]{total:,.1f}[/bold]",
        "",
        f"{cpu.get('pipeline_cores') or 0:.2f} cores busy"
        + (f"; {cpu['cpu_us_per_flight']:,} µs per flight" if "cpu_us_per_flight" in cpu else ""),
    )
    if cpu.get("other_s") is not None:
        table.add_row("rest of the machine", f"{cpu['other_s']:,.1f}", "", "not the pipeline's processes")
    return table
