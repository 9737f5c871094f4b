"""The binlog CDC mode's logic without a server: the server checks, positions, TRUNCATE, values, the config."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from connectors.rds.binlog_rows import adapter_for
from connectors.rds.binlog_setup import (
    default_server_id,
    missing_privileges,
    server_problems,
    truncates,
    version_of,
)
from connectors.rds.config import RdsSourceConfig
from connectors.rds.types import avro_type_for_sql

GOOD = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}
ALL = ["GRANT ALL PRIVILEGES ON *.* TO `threes`@`%` IDENTIFIED BY PASSWORD '*4D67'"]


def _problems(variables: dict[str, str], grants: list[str] = ALL) -> list[str]:
    return server_problems(variables, grants, user="'u'@'%'", source="orders")


def test_a_ready_server_has_no_problem() -> None:
    assert _problems(GOOD) == []
    grants = ["GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `u`@`%`"]
    assert _problems(GOOD, grants) == []
    assert missing_privileges(["GRANT BINLOG MONITOR, REPLICATION REPLICA ON *.* TO `u`@`%`"]) == []


@pytest.mark.parametrize(
    ("name", "value", "what"),
    [
        ("log_bin", "OFF", "log_bin = ON"),
        ("binlog_format", "STATEMENT", "binlog_format = ROW"),
        ("binlog_format", "MIXED", "binlog_format = ROW"),
        ("binlog_row_image", "MINIMAL", "binlog_row_image = FULL"),
        ("binlog_row_metadata", "NO_LOG", "binlog_row_metadata = FULL"),
    ],
)
def test_each_bad_setting_is_one_line_saying_what_to_set(name: str, value: str, what: str) -> None:
    (problem,) = _problems({**GOOD, name: value})
    assert what in problem and repr(value) in problem and "'orders'" in problem and "\n" not in problem
    assert "parameter group" in problem


def test_a_server_without_the_variable_counts_as_unset() -> None:
    (problem,) = _problems({k: v for k, v in GOOD.items() if k != "binlog_row_metadata"})
    assert "binlog_row_metadata = FULL" in problem and "'unset'" in problem


def test_missing_replication_privileges_say_what_to_grant() -> None:
    grants = ["GRANT USAGE ON *.* TO `u`@`%`", "GRANT ALL PRIVILEGES ON `threes`.* TO `u`@`%`"]
    (problem,) = _problems(GOOD, grants)
    assert "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'u'@'%'" in problem
    assert missing_privileges(["GRANT REPLICATION SLAVE ON *.* TO `u`@`%`"]) == ["REPLICATION CLIENT"]


def test_versions_follow_binlog_order() -> None:
    assert version_of("mariadb-bin.000001", 5) == (1 << 32) | 5
    assert version_of("mariadb-bin.000002", 4) > version_of("mariadb-bin.000001", 4_000_000_000)
    with pytest.raises(ValueError, match="sequence number"):
        version_of("nonumber", 4)


def test_server_ids_are_stable_and_away_from_hand_set_ones() -> None:
    assert default_server_id("orders") == default_server_id("orders") != default_server_id("items")
    assert 0x7E000000 <= default_server_id("orders") < 0x7F000000


@pytest.mark.parametrize(
    ("query", "schema", "expected"),
    [
        ("TRUNCATE TABLE orders", "shop", True),
        ("truncate orders", "shop", True),
        ("TRUNCATE TABLE `shop`.`orders`", "other", True),
        ("TRUNCATE TABLE shop.orders;", None, True),
        ("TRUNCATE TABLE orders", "other", False),
        ("TRUNCATE TABLE orders_old", "shop", False),
        ("ALTER TABLE orders ADD COLUMN x int", "shop", False),
    ],
)
def test_truncate_of_the_table_is_recognised(query: str, schema: str | None, expected: bool) -> None:
    assert truncates(query, schema, "shop", "orders") is expected


def test_binlog_values_become_what_a_select_returns() -> None:
    from sqlalchemy import Integer
    from sqlalchemy.dialects import mysql

    from connectors.rds.types import exact_mysql_time

    alarm = adapter_for(mysql.TIME(fsp=6))
    assert alarm is not None and alarm(dt.timedelta(hours=12, microseconds=1)) == dt.time(12, 0, 0, 1)
    assert alarm(dt.timedelta(hours=30)) == dt.timedelta(hours=30)  # no time of day: the encoder refuses it
    assert adapter_for(Integer()) is None
    # the snapshot's SELECT: SQLAlchemy's TIME would drop the day of '30:00:00' (06:00); never silently
    read = exact_mysql_time(mysql.TIME(fsp=6)).result_processor(mysql.dialect(), None)
    assert read is not None
    assert read(dt.timedelta(hours=30)) == dt.timedelta(hours=30) and read(dt.timedelta(hours=6)) == dt.time(6)
    assert exact_mysql_time(Integer()).__class__ is Integer
    avro, to_text = avro_type_for_sql(mysql.SET("x", "y", "z"))
    assert avro == "string" and to_text is not None and to_text({"z", "x"}) == "x,z" and to_text("y") == "y"


def test_the_binlog_settings_belong_to_mode_cdc() -> None:
    cfg = RdsSourceConfig(
        name="o",
        type="rds_source",
        connection="db",
        topic="t",
        table="orders",
        mode="cdc",
        binlog_purged="snapshot",
        binlog_server_id=4242,
    )
    assert cfg.binlog_purged == "snapshot" and cfg.binlog_server_id == 4242
    assert (
        RdsSourceConfig(name="o", type="rds_source", connection="db", topic="t", table="o", mode="cdc").binlog_purged
        == "stop"
    )
    with pytest.raises(ValidationError, match="apply to mode 'cdc' only"):
        RdsSourceConfig(
            name="o",
            type="rds_source",
            connection="db",
            topic="t",
            table="orders",
            mode="bulk",
            binlog_purged="snapshot",
        )
    with pytest.raises(ValidationError):
        RdsSourceConfig(
            name="o", type="rds_source", connection="db", topic="t", table="orders", mode="cdc", binlog_purged="ignore"
        )


def test_the_example_validates() -> None:
    from pathlib import Path

    from threes.config import load_pipeline

    example = Path(__file__).parents[3] / "examples" / "mysql_cdc.yaml"
    (source,) = load_pipeline(example, environ={}).sources
    assert isinstance(source, RdsSourceConfig)
    assert source.mode == "cdc" and source.exactly_once and source.binlog_purged == "stop"
    assert source.reconcile_interval_s is None  # deletes arrive as tombstones
