"""The CDC mode's logic without a server: pgoutput messages, the server checks, the names, the config."""

from __future__ import annotations

import struct

import pytest
from pydantic import ValidationError

from connectors.rds import pgoutput
from connectors.rds.cdc_setup import default_name, identity_problem, server_problems
from connectors.rds.config import RdsSourceConfig


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _tuple(*values: bytes | None | str) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "u":
            out += b"u"
        else:
            assert isinstance(v, bytes)
            out += b"t" + struct.pack(">i", len(v)) + v
    return out


def test_begin_commit_carry_lsns_and_commit_time() -> None:
    begin = pgoutput.parse(b"B" + struct.pack(">QqI", 0x16_B374D848, 1_000_000, 77))
    assert begin == pgoutput.Begin(0x16_B374D848, pgoutput.ts_ms(1_000_000), 77)
    assert pgoutput.ts_ms(0) == 946_684_800_000  # 2000-01-01 UTC
    commit = pgoutput.parse(b"C" + struct.pack(">bQQq", 0, 100, 180, 2_000_000))
    assert commit == pgoutput.Commit(100, 180, pgoutput.ts_ms(2_000_000))


def test_relation_and_changes() -> None:
    rel = pgoutput.parse(
        b"R" + struct.pack(">I", 42) + _s("public") + _s("t") + struct.pack(">bh", ord("d"), 2)
        + struct.pack(">b", 1) + _s("id") + struct.pack(">Ii", 23, -1)
        + struct.pack(">b", 0) + _s("v") + struct.pack(">Ii", 25, -1)
    )
    assert rel == pgoutput.Relation(42, "public", "t", "d", (("id", 23, True), ("v", 25, False)))
    ins = pgoutput.parse(b"I" + struct.pack(">I", 42) + b"N" + _tuple(b"1", None))
    assert ins == pgoutput.Change("insert", 42, (b"1", None), None, False)
    # an update that changed the key carries the old key (K); a TOASTed value left alone is "u"
    upd = pgoutput.parse(b"U" + struct.pack(">I", 42) + b"K" + _tuple(b"1", None) + b"N" + _tuple(b"2", "u"))
    assert upd == pgoutput.Change("update", 42, (b"2", pgoutput.UNCHANGED), (b"1", None), True)
    dele = pgoutput.parse(b"D" + struct.pack(">I", 42) + b"O" + _tuple(b"2", b"x"))
    assert dele == pgoutput.Change("delete", 42, None, (b"2", b"x"), False)
    assert pgoutput.parse(b"T" + struct.pack(">ibII", 2, 0, 42, 43)) == pgoutput.Truncate((42, 43))
    assert pgoutput.parse(b"O" + struct.pack(">Q", 1) + _s("origin")) is None


@pytest.mark.parametrize("payload", [b"X", b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"t\0"])
def test_malformed_messages_are_protocol_errors(payload: bytes) -> None:
    with pytest.raises(pgoutput.ProtocolError):
        pgoutput.parse(payload)


def test_lsn_text_round_trip() -> None:
    assert pgoutput.lsn_text(pgoutput.lsn_int("16/B374D848")) == "16/B374D848"
    with pytest.raises(ValueError):
        pgoutput.lsn_int("nope")


def test_server_problems_are_one_line_each_and_say_what_to_change() -> None:
    ok = server_problems(wal_level="logical", superuser=False, replication=True, role="app", source="s")
    assert ok == []
    both = server_problems(wal_level="replica", superuser=False, replication=False, role="app", source="s")
    assert len(both) == 2 and all("\n" not in p for p in both)
    assert "wal_level = logical" in both[0] and "'replica'" in both[0]
    assert 'ALTER ROLE "app" REPLICATION' in both[1]
    assert server_problems(wal_level="logical", superuser=True, replication=False, role="app", source="s") == []


def test_replica_identity_must_carry_the_key() -> None:
    kw = {"table": "t", "source": "s"}
    assert identity_problem(ident="d", identity_columns=["id"], key_columns=["id"], **kw) is None
    assert identity_problem(ident="f", identity_columns=[], key_columns=["code"], **kw) is None
    assert identity_problem(ident="i", identity_columns=["a", "b"], key_columns=["a"], **kw) is None
    assert "REPLICA IDENTITY FULL" in identity_problem(ident="n", identity_columns=[], key_columns=["id"], **kw)
    # `key:` other than the primary key
    assert identity_problem(ident="d", identity_columns=["id"], key_columns=["code"], **kw) is not None
    assert "no primary key" in identity_problem(ident="d", identity_columns=[], key_columns=["id"], **kw)


def test_names_and_config() -> None:
    assert default_name("Orders-DB.v2") == "threes_orders_db_v2"
    assert len(default_name("x" * 100)) == 63
    base = {"name": "a", "type": "rds_source", "connection": "pg", "topic": "t", "table": "x"}
    cfg = RdsSourceConfig(**base, mode="cdc")
    assert cfg.poll_interval_s == 0.2 and cfg.reconcile_interval_s is None
    assert RdsSourceConfig(**base, mode="cdc", poll_interval_s=1).poll_interval_s == 1
    with pytest.raises(ValidationError, match="tasks"):
        RdsSourceConfig(**base, mode="cdc", tasks=2)
    with pytest.raises(ValidationError, match="apply to mode 'cdc' only"):
        RdsSourceConfig(**base, mode="bulk", slot_name="s")
    with pytest.raises(ValidationError):
        RdsSourceConfig(**base, mode="cdc", slot_name="Bad-Name")


@pytest.mark.parametrize(
    ("given", "mode", "interval"),
    [
        ({}, "bulk", 300.0),  # no column to read incrementally: a full re-read every 5 minutes, not 5 s
        ({"timestamp_column": "u"}, "timestamp", 5.0),
        ({"incrementing_column": "id"}, "incrementing", 5.0),
        ({"timestamp_column": "u", "incrementing_column": "id"}, "timestamp+incrementing", 5.0),
        ({"mode": "bulk"}, "bulk", 5.0),  # asked for explicitly
        ({"poll_interval_s": 30}, "bulk", 30.0),
    ],
)
def test_default_mode_never_republishes_the_table_every_5_s(given: dict, mode: str, interval: float) -> None:
    cfg = RdsSourceConfig(name="a", type="rds_source", connection="pg", topic="t", table="x", **given)
    assert (cfg.mode, cfg.poll_interval_s) == (mode, interval)
