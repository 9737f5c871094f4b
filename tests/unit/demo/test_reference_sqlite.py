"""The reference loader's diff on an in-process SQLite database (PostgreSQL is covered in tests/e2e)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from connectors.rds.connection import RdsConnection, sql_engine
from threes.demo.data import read_frame
from threes.demo.reference import load_sql, sql_table


def test_load_is_a_diff_second_load_changes_nothing(tmp_path: Path) -> None:
    conn = RdsConnection(type="rds", url=f"sqlite:///{tmp_path / 'ref.db'}")
    airports = read_frame("airports")
    first = load_sql(conn, "airports", airports)
    assert (first.inserted, first.updated, first.deleted, first.unchanged) == (1_458, 0, 0, 0)
    second = load_sql(conn, "airports", airports)
    assert (second.inserted, second.updated, second.deleted, second.unchanged) == (0, 0, 0, 1_458)

    changed = airports.copy()
    changed.loc[changed.faa == "ORD", "name"] = "Chicago (renamed)"
    changed.loc[changed.faa == "LAX", "tzone"] = None
    changed = changed[changed.faa != "JFK"]
    third = load_sql(conn, "airports", changed)
    assert (third.inserted, third.updated, third.deleted, third.unchanged) == (0, 2, 1, 1_455)

    engine = sql_engine(conn)
    table = sql_table("airports", "airports")
    with engine.connect() as db:
        rows = {r.faa: r for r in db.execute(select(table))}
    engine.dispose()
    assert len(rows) == 1_457 and "JFK" not in rows
    assert rows["ORD"].name == "Chicago (renamed)" and rows["LAX"].tzone is None
    assert rows["ORD"].updated_at >= rows["BOS"].updated_at
    assert rows["BOS"].lat == float(airports.loc[airports.faa == "BOS", "lat"].iloc[0])  # bit for bit

    back = load_sql(conn, "airports", airports)
    assert (back.inserted, back.updated, back.deleted) == (1, 2, 0)
