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
