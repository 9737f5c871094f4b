"""The broker restart drill: Kafka stops under a running ``threes run`` and starts again; nothing is lost.

The shop of ``test_first_pipeline.py`` (its own copy: topics, tables, index and
bucket unique to this module) runs under ``threes run``. Half of the orders are
replayed and reach every sink; then the local stack's broker is stopped
(``threes local down --service kafka``) for ``THREES_KAFKA_OUTAGE_S`` seconds
(20) and started again, and the other half is replayed. The run must ride the
outage out by itself: ``threes run`` never exits, its parts reconnect or are
restarted by its supervisor, and in the end every sink equals the oracle (each
order enriched once under its key, the per-category aggregates exact: no
event counted twice or lost). A Ctrl-C then stops it with exit code 0.

Beside it, a reader takes the readings ``threes run``'s supervisor takes (every
topic's watermarks, every sync group's committed offsets: ``KafkaProbe.flow``)
every 0.2 s through the outage, so a request that is in flight when the broker
goes away happens many times, not once per two seconds: it must still be
running, and reading, afterwards. (librdkafka 2.16's admin
``list_consumer_group_offsets`` aborted the process in that window: a CI run
lost ``threes run`` to it.)

It stops the broker every other test uses: it runs alone, after them (``serial``).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import signal
import subprocess
import time
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.e2e import test_first_pipeline as first
from tests.e2e.test_first_pipeline import FIELDS, N_ORDERS, THREES, Output, Sinks, oracle, wait_for

pytestmark = pytest.mark.serial
shop = first.shop  # the first pipeline's fixture: this module gets its own shop (module scope)

OUTAGE_S = float(os.environ.get("THREES_KAFKA_OUTAGE_S", "20"))

# The supervisor's readings (threes run's live view), taken every 0.2 s; one line per reading.
READER = """
import sys, time
from confluent_kafka import KafkaException
from threes.config import load_pipeline
from kernel.exceptions import ThreesError
from threes.pipeline.kafka_probe import KafkaProbe

pipeline = load_pipeline(sys.argv[1])
probe = KafkaProbe(pipeline.kafka)
while True:
    try:
        flow = probe.flow(pipeline)
        print("reading", sum(flow.committed.values()), flush=True)
    except (ThreesError, KafkaException) as exc:
        print("no answer", type(exc).__name__, flush=True)
    time.sleep(0.2)
"""


def _local(*args: str) -> None:
    """``threes local ...`` of the project's stack (the one every test shares)."""
    subprocess.run([str(ROOT / ".venv" / "bin" / "threes"), "local", *args], check=True, cwd=ROOT, timeout=300,
                   capture_output=True)


def _log_restart(what: str) -> None:
    with open("/tmp/threes-restarts.log", "a") as f:
        f.write(f"{dt.datetime.now(dt.UTC).isoformat()} {what}; why: tests/e2e/test_kafka_restart.py "
                f"(broker restart drill, {OUTAGE_S:g} s)\n")


def _write_orders(path: Any, orders: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(orders[0]))
        writer.writeheader()
        for o in orders:
            writer.writerow({**o, "order_time": o["order_time"].strftime("%Y-%m-%dT%H:%M:%SZ")})


def _replay(folder: Any, names: dict[str, str], env: dict[str, str], csv_name: str) -> None:
    done = subprocess.run(  # our own console script
        [THREES, "replay", csv_name, "--topic", f"orders.{names['u']}", "--schema", "schemas/order.avsc",
         "--key", "order_id", "--config", "pipeline.yaml"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_broker_restart_under_threes_run_loses_and_doubles_nothing(
    shop: Any, pg: Any, es_conn: Any, s3_conn: Any
) -> None:
    folder, names, data, _pipeline, env = shop
    half = N_ORDERS // 2
    _write_orders(folder / "orders_a.csv", data["orders"][:half])
    _write_orders(folder / "orders_b.csv", data["orders"][half:])
    enriched, per_category = oracle(data)
    sinks = Sinks(names, pg, es_conn, s3_conn)
    process = subprocess.Popen(  # our own console script
        [THREES, "run", "pipeline.yaml", "--log-dir", "logs", "--offsets-topic", f"_threes_offsets.{names['u']}"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    output = Output(process, folder / "logs")
    kafka_down, reader = False, None
    try:
        wait_for("ready pipeline", lambda: any(line.startswith("[run] running:") for line in output.lines), 240,
                 process, output)
        _replay(folder, names, env, "orders_a.csv")
        wait_for("the first half in Elasticsearch", lambda: sinks.es_count() == half, 240, process, output)

        reader = subprocess.Popen(  # our own interpreter
            [str(ROOT / ".venv" / "bin" / "python"), "-c", READER, "pipeline.yaml"], cwd=folder, env=env,
            stdout=(folder / "reader.out").open("w"), stderr=subprocess.DEVNULL, start_new_session=True,
        )
        wait_for("the reader's first reading", lambda: "reading" in (folder / "reader.out").read_text(), 60,
                 process, output)
        _log_restart("threes local down --service kafka, then up")
        _local("down", "--service", "kafka")
        kafka_down = True
        deadline = time.monotonic() + OUTAGE_S
        while time.monotonic() < deadline:
            assert process.poll() is None, "threes run exited while Kafka was down:\n" + output.text()[-6000:]
            time.sleep(1.0)
        _local("up", "--service", "kafka")
        kafka_down = False
        outage_lines = len((folder / "reader.out").read_text().splitlines())

        _replay(folder, names, env, "orders_b.csv")
        wait_for("complete Elasticsearch index", lambda: sinks.es_count() == N_ORDERS, 420, process, output)
        wait_for("complete sales table", lambda: sinks.sales() == per_category, 420, process, output)
        wait_for("complete archive", lambda: len(sinks.archive()) == N_ORDERS, 420, process, output)
        docs, archive = sinks.es_docs(), sinks.archive()
        read = (folder / "reader.out").read_text().splitlines()
        assert reader.poll() is None, f"the reader of threes run's readings died ({reader.returncode}): {read[-5:]}"
        assert any(line.startswith("reading") for line in read[outage_lines:]), read[-5:]
    finally:
        if reader is not None:
            reader.kill()
        if kafka_down:
            _local("up", "--service", "kafka")
        process.send_signal(signal.SIGINT)  # Ctrl-C
        returncode = process.wait(240)
    time.sleep(0.5)  # the reader thread takes the last lines
    said = output.text()
    assert returncode == 0, said[-6000:]
    assert "Traceback" not in said  # threes run itself never printed one
    assert {k: {f: d.get(f) for f in FIELDS} for k, d in docs.items()} == {str(i): e for i, e in enriched.items()}
    assert sinks.sales() == per_category  # each order counted once, none lost
    assert {json.loads(k)["order_id"]: {f: r["value"][f] for f in FIELDS} for k, r in archive.items()} == enriched
    restarts = [line for line in output.lines if "restarting in" in line]
    print(f"broker down {OUTAGE_S:g} s: part restarts {len(restarts)}: {restarts}")
