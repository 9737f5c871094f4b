"""``threes run``'s management API on a real pipeline: a PostgreSQL source and a PostgreSQL sink, real Kafka.

One ``threes run`` (sources and sync, as child processes) serves the API; the tests act on it
the way an operator would (HTTP with the token from the run's discovery file, ``threes ctl``,
``threes offsets reset``) and check what the parts do, in PostgreSQL and Kafka:

* a paused sink writes nothing while records keep coming (a trigger logs every row written),
  keeps its partitions, and after resume writes every record exactly once;
* a restart of the sync part while records flow loses none and duplicates none;
* an offsets reset is refused (409) while the sources run, through the API and through
  ``threes offsets reset`` (the run holds the lock), and done once they are paused;
* an invalid ``PUT /pipeline`` is refused with ``validate``'s file:line problems, and a valid
  one restarts only the part whose config changed;
* 200 concurrent calls are all answered; a call without or with a wrong token gets 401.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from tests.integration.ops.helpers import metric
from tests.integration.sync.helpers import UpdateProducer, create_topic, group_lag, wait_until
from threes.pipeline.endpoint import read_discovery
from threes.pipeline.lock import lock_path
from threes.testing.plugin import draw_unique

THREES = str(Path(sys.executable).with_name("threes"))

CONFIG = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
connections:
  pg: {{type: rds, url: "{url}", password: "${{env:THREES_PGPASS}}"}}
sources:
  - {{name: things_{u}, type: rds_source, connection: pg, topic: things.{u}, table: things_{u},
     mode: timestamp, timestamp_column: updated_at, commit_delay_s: 0, poll_interval_s: 1}}
sync:
  - name: mgmt_{u}
    dead_letter_topic: dlq.{u}
    metrics_port: {sync_port}
    batch: {{max_records: {max_records}, max_age_ms: 100}}
    sinks:
      - {{name: db, type: rds_sink, connection: pg, topics: [updates.{u}], table: items_{u}, key: [id],
         create_table: true}}
"""


class Api:
    """The run's API: its URL and token from the discovery file beside the run's lock."""

    def __init__(self, config: Path):
        found = read_discovery(lock_path(config))
        assert found is not None
        self.url, self.token = found["url"], found["token"]

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        token: str | None = "own",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {self.token if token == 'own' else token}"
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def part(self, name: str) -> dict[str, Any]:
        code, doc = self.call("GET", f"/parts/{name}", token=None)  # reads are open on loopback
        assert code == 200, doc
        return dict(doc)


class Run:
    """A running ``threes run`` of the test's pipeline, and what the test needs around it."""

    def __init__(self, folder: Path, kafka: KafkaConfig, pg: RdsConnection, unique: str, sync_port: int):
        self.folder, self.unique, self.sync_port, self.kafka = folder, unique, sync_port, kafka
        self.config = folder / "pipeline.yaml"
        self.fields = {"bootstrap": kafka.bootstrap_servers, "url": pg.url, "u": unique, "sync_port": sync_port}
        self.config.write_text(CONFIG.format(**self.fields, max_records=50))
        self.env = {**os.environ, "THREES_PGPASS": pg.password.get_secret_value()}
        self.process = subprocess.Popen(
            [THREES, "run", str(self.config), "--api-port", "0", "--log-dir", str(folder / "logs")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=folder,
            env=self.env,
        )
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        wait_until(lambda: read_discovery(lock_path(self.config)) is not None, 60, "the run's API")
        self.api = Api(self.config)
        wait_until(
            lambda: all(p["state"] == "ready" for p in self.api.call("GET", "/parts")[1]),
            180,
            "every part ready",
            interval_s=1.0,
        )

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line.rstrip("\n"))

    def sync_status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.sync_port}/status.json", timeout=10) as resp:
            return dict(json.loads(resp.read())["sync"][0])

    def sync_state(self) -> str:
        return str(self.sync_status()["state"])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(120)


@pytest.fixture(scope="module")
def run(
    tmp_path_factory: pytest.TempPathFactory,
    kafka: KafkaConfig,
    kafka_conf: dict[str, Any],
    pg: RdsConnection,
    pg_engine: Any,
) -> Iterator[Run]:
    from tests.integration.ops.helpers import free_port

    unique = draw_unique()
    with pg_engine.begin() as conn:
        conn.execute(
            text(
                f"CREATE TABLE things_{unique} (id bigint PRIMARY KEY, name text, "
                "updated_at timestamptz NOT NULL DEFAULT now())"
            )
        )
        conn.execute(
            text(f"INSERT INTO things_{unique} (id, name) SELECT g, 'thing ' || g FROM generate_series(1, 5) g")
        )
    create_topic(kafka_conf, f"updates.{unique}", 2)
    started = Run(tmp_path_factory.mktemp("mgmt"), kafka, pg, unique, free_port())
    try:
        yield started
    finally:
        started.stop()


def _written(engine: Any, unique: str) -> tuple[int, int, int]:
    """``(rows in the table, row writes logged by the trigger, distinct ids logged)``."""
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT count(*) FROM items_{unique}")).scalar_one()
        logged, distinct = conn.execute(text(f"SELECT count(*), count(DISTINCT id) FROM log_{unique}")).one()
    return int(rows), int(logged), int(distinct)


def _log_writes(engine: Any, unique: str) -> None:
    """From now on every row the sink writes (insert or update) is logged in ``log_<unique>``."""
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE log_{unique} (id bigint NOT NULL)"))
        conn.execute(
            text(
                f"CREATE FUNCTION log_{unique}() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN INSERT INTO log_{unique} VALUES (NEW.id); RETURN NEW; END $$"
            )
        )
        conn.execute(
            text(
                f"CREATE TRIGGER log_{unique} AFTER INSERT OR UPDATE ON items_{unique} "
                f"FOR EACH ROW EXECUTE FUNCTION log_{unique}()"
            )
        )


def test_a_paused_sink_writes_nothing_and_resumes_without_loss_or_duplicates(
    run: Run, kafka: KafkaConfig, kafka_conf: dict[str, Any], pg_engine: Any
) -> None:
    u, api = run.unique, run.api
    producer = UpdateProducer(kafka, f"updates.{u}")
    for key in range(100):
        producer.send(key, 1)
    producer.flush()
    group = f"threes-sync-mgmt_{u}"
    wait_until(lambda: group_lag(kafka_conf, group, f"updates.{u}") == 0, 90, "the first 100 written")
    _log_writes(pg_engine, u)
    pid = api.part("sync")["pid"]

    code, doc = api.call("POST", "/parts/sync/pause")
    assert code == 202 and doc["state"] == "paused", doc
    wait_until(lambda: run.sync_state() == "paused", 30, "the sync service paused (nothing in flight)")
    committed = _committed(kafka_conf, group, f"updates.{u}")
    loading = threading.Thread(target=lambda: [producer.send(k, 1) for k in range(100, 2100)])
    loading.start()  # under load: 2,000 records arrive while it is paused
    loading.join()
    producer.flush()
    # it still polls (the group keeps it) and sees the new end offsets: its lag shows all 2,000 waiting
    wait_until(lambda: group_lag(kafka_conf, group, f"updates.{u}") == 2000, 30, "the records waiting")
    # another member joins, takes a partition and leaves: the partition comes back with records waiting on it
    _rebalance(run, kafka_conf, group, f"updates.{u}")
    assert _written(pg_engine, u) == (100, 0, 0)  # nothing written while paused
    assert _committed(kafka_conf, group, f"updates.{u}") == committed  # and its offsets stay
    assert api.part("sync")["pid"] == pid and api.part("sync")["state"] == "paused"

    code, doc = api.call("POST", "/parts/sync/resume")
    assert code == 202 and doc["state"] == "ready", doc
    wait_until(lambda: _written(pg_engine, u)[0] == 2100, 90, "every record written after resume")
    wait_until(lambda: group_lag(kafka_conf, group, f"updates.{u}") == 0, 30, "the offsets committed")
    assert _written(pg_engine, u) == (2100, 2000, 2000)  # each of the 2,000 written once


def test_a_restart_while_records_flow_loses_nothing(
    run: Run, kafka: KafkaConfig, kafka_conf: dict[str, Any], pg_engine: Any
) -> None:
    u, api = run.unique, run.api
    before = api.part("sync")
    base = _written(pg_engine, u)
    producer = UpdateProducer(kafka, f"updates.{u}")
    flowing = threading.Event()

    def load() -> None:
        for k in range(10_000, 13_000):
            producer.send(k, 1)
            if k == 10_500:
                flowing.set()
        producer.flush()

    loading = threading.Thread(target=load)
    loading.start()
    flowing.wait(60)
    code, doc = api.call("POST", "/parts/sync/restart")
    assert code == 202 and doc["state"] == "stopping", doc
    loading.join()
    wait_until(
        lambda: api.part("sync")["state"] == "ready" and api.part("sync")["pid"] != before["pid"],
        120,
        "the sync part restarted",
    )
    wait_until(lambda: _written(pg_engine, u)[0] == base[0] + 3000, 120, "every record written")
    after = api.part("sync")
    assert after["restarts"] == before["restarts"] + 1
    rows, logged, distinct = _written(pg_engine, u)
    assert distinct - base[2] == 3000  # none lost
    assert logged - base[1] == 3000  # none written twice: the clean stop committed what it wrote


def test_an_offsets_reset_is_refused_while_the_sources_run(run: Run) -> None:
    api = run.api
    code, doc = api.call("DELETE", "/parts/sources/offsets")
    assert code == 409 and "pause it first" in doc["error"], doc
    cli = subprocess.run(
        [THREES, "offsets", "reset", str(run.config), "-y"],
        capture_output=True,
        text=True,
        timeout=120,
        env=run.env,
        cwd=run.folder,
    )
    assert cli.returncode == 1 and "409" in cli.stderr and "Traceback" not in cli.stderr, cli.stderr
    code, stored = api.call("GET", "/parts/sources/offsets")
    assert code == 200 and [p["connector"] for p in stored["offsets"]] == [f"things_{run.unique}"], stored

    assert api.call("POST", "/parts/sources/pause")[0] == 202
    wait_until(lambda: api.part("sources")["state"] == "paused", 60, "the sources stopped")
    assert api.part("sources")["pid"] is None  # nothing polls
    cli = subprocess.run(
        [THREES, "offsets", "reset", str(run.config), "-y"],
        capture_output=True,
        text=True,
        timeout=120,
        env=run.env,
        cwd=run.folder,
    )
    assert cli.returncode == 0, cli.stderr
    assert api.call("GET", "/parts/sources/offsets")[1]["offsets"] == []
    assert api.call("POST", "/parts/sources/resume")[0] == 202
    wait_until(lambda: api.part("sources")["state"] == "ready", 120, "the sources snapshotted again")


def test_put_pipeline_refuses_an_invalid_revision_and_restarts_only_what_changed(run: Run) -> None:
    api = run.api
    before = {p["name"]: p for p in api.call("GET", "/parts")[1]}
    bad = CONFIG.format(**run.fields, max_records=50).replace("poll_interval_s: 1", "poll_interval_s: soon")
    code, doc = api.call("PUT", "/pipeline", bad.encode(), headers={"Content-Type": "application/yaml"})
    assert code == 400 and doc["problems"], doc
    assert all(p.startswith(f"{run.config}:") for p in doc["problems"]), doc  # file:line, as `threes validate`
    assert any("poll_interval_s" in p for p in doc["problems"]), doc
    assert run.config.read_text() == CONFIG.format(**run.fields, max_records=50)  # the file is unchanged

    text = CONFIG.format(**run.fields, max_records=50)
    without_sources = text[: text.index("sources:")] + text[text.index("sync:") :]
    code, doc = api.call("PUT", "/pipeline", without_sources.encode())
    assert code == 409 and "restart `threes run`" in doc["error"], doc  # another set of parts: not here
    assert run.config.read_text() == text

    good = CONFIG.format(**run.fields, max_records=80)  # only the sync service's batch changes
    code, doc = api.call("PUT", "/pipeline", good.encode())
    assert code == 200 and doc["changed"] == ["sync"] and doc["restarted"] == ["sync"], doc
    wait_until(
        lambda: api.part("sync")["state"] == "ready" and api.part("sync")["pid"] != before["sync"]["pid"],
        120,
        "sync restarted",
    )
    after = {p["name"]: p for p in api.call("GET", "/parts")[1]}
    assert after["sources"]["pid"] == before["sources"]["pid"]  # not restarted
    assert after["sources"]["config_revision"] == before["sources"]["config_revision"]
    assert after["sync"]["config_revision"] != before["sync"]["config_revision"]


def test_200_concurrent_calls_and_the_refusals(run: Run) -> None:
    api = run.api
    calls = (
        [("GET", "/parts", "own")] * 150
        + [("GET", "/parts/sync", None)] * 40
        + [("POST", "/parts/sync/resume", "own")] * 10
    )  # resuming a running part changes nothing
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda c: api.call(c[0], c[1], token=c[2]), calls))
    assert [code for code, _ in answers] == [200] * 190 + [202] * 10
    assert all(len(doc) == 2 for code, doc in answers[:150])

    assert api.call("POST", "/parts/sync/pause", token=None)[0] == 401
    assert api.call("POST", "/parts/sync/pause", token="wrong")[0] == 401
    code, doc = api.call(
        "POST",
        "/parts/sync/pause",
        b"csrf=guess",
        token=None,
        headers={"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://evil.example"},
    )
    assert code == 403 and doc == {"error": "cross-origin request refused"}
    assert api.part("sync")["state"] == "ready"  # none of them paused it
    assert api.call("GET", "/parts/nothing")[0] == 404


def test_threes_ctl_calls_the_api(run: Run) -> None:
    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [THREES, "ctl", *args], capture_output=True, text=True, timeout=120, env=run.env, cwd=run.folder
        )

    listed = ctl("list", "--config", str(run.config), "--json")
    assert listed.returncode == 0, listed.stderr
    assert [p["name"] for p in json.loads(listed.stdout)] == ["sources", "sync"]
    status = ctl("status", "sync", "--url", run.api.url, "--token", run.api.token)
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "ready", status.stderr
    unknown = ctl("pause", "nothing", "--config", str(run.config))
    assert unknown.returncode == 1 and unknown.stderr.startswith("error 404: no part 'nothing' in this run")
    wrong = ctl("restart", "sync", "--url", run.api.url, "--token", "wrong")
    assert wrong.returncode == 1 and "error 401: wrong bearer token" in wrong.stderr
    assert "Traceback" not in unknown.stderr + wrong.stderr and run.api.token not in wrong.stderr


def _rebalance(run: Run, kafka_conf: dict[str, Any], group: str, topic: str) -> None:
    """Another member joins the paused service's group, takes a partition, and leaves: two rebalances."""
    from confluent_kafka import Consumer

    intruder = Consumer(
        {
            **kafka_conf,
            "group.id": group,
            "enable.auto.commit": False,
            "partition.assignment.strategy": "cooperative-sticky",
            "auto.offset.reset": "earliest",
        }
    )
    taken: list[Any] = []
    intruder.subscribe([topic], on_assign=lambda _c, parts: taken.extend(parts))
    try:
        wait_until(
            lambda: (intruder.poll(0.2), bool(taken) and len(run.sync_status()["partitions"]) < 2)[1],
            90,
            "a partition moved to the other member",
        )
    finally:
        intruder.close()  # it leaves: its partition goes back to the paused service (uncommitted: nothing moved)
    wait_until(lambda: len(run.sync_status()["partitions"]) == 2, 90, "the partition back with the service")
    assert all(p["paused"] for p in run.sync_status()["partitions"])
    # none of the records waiting on the returned partition was fetched into the buffers
    assert metric(run.sync_port, "threes_sync_buffered_bytes") == 0


def _committed(kafka_conf: dict[str, Any], group: str, topic: str) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**kafka_conf, "group.id": group, "enable.auto.commit": False})
    try:
        parts = consumer.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
        return [p.offset for p in parts]
    finally:
        consumer.close()
