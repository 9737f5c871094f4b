"""The data-path process settings (connectors/runtime/process.py)."""

from __future__ import annotations

import gc

import pytest

from connectors.runtime.process import DEFAULT_GC_THRESHOLD_0, GC_ENV, tune_gc


@pytest.fixture(autouse=True)
def _restore_gc():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_default_threshold_makes_young_collections_rarer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GC_ENV, raising=False)
    gc.set_threshold(700, 10, 10)
    assert tune_gc() == (DEFAULT_GC_THRESHOLD_0, 10, 10)
    assert gc.get_freeze_count() > 0  # start-up objects are out of every later collection


def test_environment_sets_or_keeps_pythons_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    gc.set_threshold(700, 10, 10)
    monkeypatch.setenv(GC_ENV, "0")
    assert tune_gc() == (700, 10, 10)
    monkeypatch.setenv(GC_ENV, "50000")
    assert tune_gc() == (50000, 10, 10)


@pytest.mark.parametrize("raw", ["x", "-1", "1.5"])
def test_bad_environment_value_is_named(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(GC_ENV, raw)
    with pytest.raises(ValueError, match=GC_ENV):
        tune_gc()


_PANDAS_PROBE = """
import json, sys
from connectors.runtime.process import keep_pandas_out
kept = keep_pandas_out()
import pyarrow as pa, polars as pl
from schemas.columnar import ColumnarDecoder
from schemas.serde import AvroSerializer
from schemas.store import InMemorySchemaStore
store = InMemorySchemaStore()
body = AvroSerializer("long", store)(7)
keys = ColumnarDecoder(store).decode_objects(body[2:10], [body[10:]] * 3)
frame = pl.from_arrow(pa.table({"a": pa.array([1, 2, 3])}))
print(json.dumps({"kept": kept, "pandas": sys.modules.get("pandas") is not None, "keys": keys,
                  "sum": int(frame["a"].sum()), "numpy": pa.array([4, 5]).to_numpy().tolist()}))
"""


@pytest.mark.parametrize("allow", [False, True])
def test_pandas_is_kept_out_and_pyarrow_and_polars_work_without_it(allow: bool) -> None:
    """pyarrow's first call loads pandas when installed; kept out, the columnar decode still works."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from connectors.runtime.process import PANDAS_ENV

    env = {k: v for k, v in os.environ.items() if k != PANDAS_ENV} | ({PANDAS_ENV: "1"} if allow else {})
    out = subprocess.run([sys.executable, "-c", _PANDAS_PROBE], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[3], check=True, timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"kept": not allow, "pandas": allow, "keys": [7, 7, 7], "sum": 6, "numpy": [4, 5]}
