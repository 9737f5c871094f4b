"""The kernel package's contracts with the rest: deprecated import paths, what each technology declares."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from connectors.elasticsearch.connection import ElasticsearchConnection
from connectors.rds.connection import RdsConnection
from connectors.s3.connection import S3Connection
from kernel.config.models import ConnectionConfig
from threes.local.needs import services_for_pipeline


@pytest.mark.parametrize(("old", "new", "name"), [
    ("connectors.config.models", "kernel.config.models", "KafkaConfig"),
    ("connectors.exceptions", "kernel.exceptions", "RetriableError"),
])
def test_the_old_import_paths_warn_and_give_the_same_objects(old: str, new: str, name: str) -> None:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert deprecations, f"importing {old} gave no DeprecationWarning"
    assert new in str(deprecations[0].message)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_each_technology_declares_its_local_services() -> None:
    assert RdsConnection(type="rds", url="postgresql+psycopg://u@127.0.0.1/db").local_services() == ("postgres",)
    assert RdsConnection(type="rds", url="mysql+pymysql://u@127.0.0.1/db").local_services() == ("mysql",)
    assert RdsConnection(type="rds", url="sqlite:///x.db").local_services() == ()
    assert ElasticsearchConnection(type="elasticsearch", hosts=["http://127.0.0.1:9200"]).local_services() == (
        "elasticsearch",)
    assert S3Connection(type="s3", endpoint_url="http://127.0.0.1:9000").local_services() == ("s3",)


def test_a_technology_the_stack_does_not_run_needs_only_kafka() -> None:
    class JsonFileConnection(ConnectionConfig):
        type: str = "jsonfile"

    class Pipeline:
        connections = {"files": JsonFileConnection(), "db": RdsConnection(type="rds", url="mysql+pymysql://u@h/d")}
        stream = None

    assert services_for_pipeline(Pipeline()) == ["kafka", "mysql"]
