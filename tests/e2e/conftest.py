"""End-to-end fixtures: an isolated copy of the example pipeline, and its cleanup."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.elasticsearch.connection import elasticsearch_client
from connectors.rds.connection import sql_engine
from connectors.s3.connection import s3_client
from threes.config import load_pipeline
from threes.demo.isolate import free_port, write_isolated

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "nycflights13" / "pipeline.yaml"


def _environ(endpoints: Any) -> dict[str, str]:
    """The example YAML reads its endpoints from THREES_* variables: point them at the test stack."""
    import os

    return {**os.environ, **endpoints.as_env()}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def example_yaml(workdir: Path) -> Path:
    """The pipeline YAML :func:`isolated` copies: the example's; a module overrides it to run a variant."""
    return EXAMPLE


@pytest.fixture(scope="module")
def isolated(workdir: Path, endpoints: Any, example_yaml: Path) -> Iterator[Any]:
    """The pipeline of ``example_yaml`` with every topic, table, index, prefix, group and port unique to this module.

    Yields:
        ``(config path, pipeline, offsets topic)``; afterwards everything the run created is removed.
    """
    unique = uuid.uuid4().hex[:10]
    with pytest.MonkeyPatch.context() as patch:
        for var, value in endpoints.as_env().items():
            patch.setenv(var, value)  # the children (sources, stream job, sync) inherit them
        patch.setenv("THREES_CHECKPOINTS", str(workdir / "checkpoints"))
        config = write_isolated(example_yaml, workdir / "pipeline.yaml", unique, free_port)
        pipeline = load_pipeline(config, environ=_environ(endpoints))
        offsets_topic = f"_threes_offsets.{unique}"
        yield config, pipeline, offsets_topic
        cleanup(pipeline, offsets_topic)


def cleanup(pipeline: Any, offsets_topic: str) -> None:
    """Remove the isolated pipeline's topics, sinks and reference copies (best effort, never masks a failure)."""
    from elasticsearch import NotFoundError
    from sqlalchemy.schema import DropSchema

    from threes.demo.reset import clear_sinks, delete_groups, delete_topics, pipeline_topics

    try:
        delete_topics(pipeline, [*pipeline_topics(pipeline), offsets_topic])
        delete_groups(pipeline)
        clear_sinks(pipeline)
        for source in pipeline.sources:
            conn = pipeline.connections[source.connection]
            if source.type == "rds_source":
                engine = sql_engine(conn)
                with engine.begin() as db:
                    db.execute(DropSchema(source.schema_name, cascade=True, if_exists=True))
                engine.dispose()
            elif source.type == "elasticsearch_source":
                es = elasticsearch_client(conn)
                try:
                    es.indices.delete(index=source.index)
                except NotFoundError:
                    pass
                es.close()
            elif source.type == "s3_source":
                s3 = s3_client(conn)
                for obj in s3.list_objects_v2(Bucket=source.bucket, Prefix=source.prefix).get("Contents", []):
                    s3.delete_object(Bucket=source.bucket, Key=obj["Key"])
    except Exception as exc:  # cleanup must not hide the test's own result
        print(f"cleanup of the isolated pipeline failed: {exc}")
