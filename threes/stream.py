"""``threes stream ...``: run the PySpark stream job, show the schemas it writes."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from kernel.exceptions import ConfigError, ThreesError

log = logging.getLogger(__name__)

stream_cli = typer.Typer(help="Run the PySpark stream job (enrich events against snapshots).", no_args_is_help=True)

ConfigArg = Annotated[Path, typer.Argument(help="connector config YAML", show_default=False)]


def _stream(config: Path):  # the pipeline model is built at runtime
    from threes.console import fail, load

    pipeline = load(config)
    if pipeline.stream is None:
        raise fail(ThreesError(f"{config}: no `stream:` section"))
    return pipeline


def _s3a_jars(checkpoint_location: str) -> list[Path] | None:
    """hadoop-aws and the AWS SDK bundle of the local stack for an ``s3a://`` checkpoint, when resolved.

    ``threes local up --service spark`` resolves them (``.threes/spark-s3a-jars-<hadoop version>``); a
    cluster elsewhere needs them at the same path on every host, or brings its own
    (then the job's start-up check finds S3A on Spark's class path). Never downloaded
    here: 560 MB should not land silently in whatever folder the job runs from.
    """
    if not checkpoint_location.startswith("s3a://"):
        return None
    from threes.local import LocalStack
    from threes.local.spark import s3a_jars_dir

    stack = LocalStack()
    return stack.spark_s3a_jars() if s3a_jars_dir(stack.layout).is_dir() else None


@stream_cli.command()
def run(
    config: ConfigArg,
    available_now: Annotated[
        bool, typer.Option("--available-now", help="process the events there are now, then stop")
    ] = False,
    master: Annotated[str | None, typer.Option(help="Spark master URL, overrides stream.spark.master")] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="serve metrics here, overrides stream.metrics_port")
    ] = None,
) -> None:
    """Run the stream job until stopped (Ctrl-C / SIGTERM stop it after the running micro-batch)."""
    from stream_app.job import StreamJob
    from stream_app.session import spark_session
    from threes.console import fail
    from threes.local.stack import resolved_spark_jars

    pipeline = _stream(config)
    if metrics_port:  # `threes run` gives one when the config has none: its readiness signal
        pipeline.stream = pipeline.stream.model_copy(update={"metrics_port": metrics_port})
    settings = pipeline.stream.spark
    if master:
        settings = settings.model_copy(update={"master": master})
    try:
        from kernel.kafka.topics import cluster_metadata

        # before the SparkSession (seconds to start): a refused login or certificate fails at once, in one line
        meta = cluster_metadata(pipeline.kafka.librdkafka_config(), pipeline.kafka.request_timeout_s)
        from stream_app.job_topics import check_input_topics

        check_input_topics(pipeline.stream, meta.topics)  # a missing input topic: one line, before Spark starts
        extra = None
        if pipeline.stream.mode == "realtime":  # the snapshot lookups run in the JVM: the component's jar
            from stream_app.realtime import lookup_jar

            extra = [lookup_jar()]
        spark = spark_session(settings, resolved_spark_jars(), _s3a_jars(pipeline.stream.checkpoint_location), extra)
        try:
            StreamJob(pipeline.stream, pipeline.kafka, spark, base_dir=config.parent).run(available_now)
        finally:
            _stop_spark(spark)
    except ConfigError as exc:  # the plan's problems (schemas, lookups): with the file and line of each key
        from kernel.config.loader import locate

        raise fail(ConfigError(locate(exc.problems, config))) from None
    except ThreesError as exc:
        raise fail(exc) from None


def _stop_spark(spark: Any) -> None:
    """Stop the SparkContext while Python still holds its gateway, then return.

    Left to the interpreter's exit, the driver JVM stops Spark from its shutdown hook after the
    gateway is gone: tens of seconds of pools and threads timing out, and errors from the Python
    side that exited first (``SparkEnv not active``, ``EOFError``).
    """
    started = time.monotonic()
    try:
        spark.stop()
    except Exception as exc:  # the job has stopped: a failed teardown is only logged
        log.warning("stopping Spark: %s", exc)
    log.info("spark stopped elapsed_s=%.1f", time.monotonic() - started)


@stream_cli.command()
def schemas(config: ConfigArg) -> None:
    """Print the Avro schemas the job writes (enriched events, update keys and values) as JSON."""
    from stream_app.plan import build_plan
    from threes.console import fail

    pipeline = _stream(config)
    try:
        plan = build_plan(pipeline.stream, None, config.parent)
        if plan is None:  # snapshots without reader schemas: their topics' writer schemas from the schema store
            from schemas.store import SchemaStore

            store = SchemaStore(pipeline.kafka.librdkafka_config(), pipeline.kafka.schema_topic)
            plan = build_plan(pipeline.stream, None, config.parent, store.version_schemas)
        if plan is None:  # with writer schemas every schema is known, but for a transform's output
            raise ThreesError(
                f"stream.transform ({pipeline.stream.transform}): the enriched and update schemas follow the "
                "function's output, which Spark computes when the job starts; this command runs no Spark"
            )
    except ThreesError as exc:
        raise fail(exc) from None
    out = {"enriched": {"topic": pipeline.stream.enriched_topic, "schema": plan.enriched.avro}}
    for update in plan.updates:
        out[update.config.topic] = {"key": update.key.avro, "value": update.value.avro}
    typer.echo(json.dumps(out, indent=2))


def _query_served(stream: Any, snapshot: str, key: list[str], as_of: str | None) -> tuple[int, Any] | None:
    """The answer of a running ``threes serve`` of this pipeline, or ``None`` when none runs."""
    from stream_app.serve import default_state_dir, running_server
    from threes.console import fail
    from threes.serve import query_server

    url = running_server(default_state_dir(stream.name).resolve())
    if url is None:
        return None
    token = None if stream.metrics_token is None else stream.metrics_token.get_secret_value()
    try:
        return query_server(url, snapshot, key, as_of, token)
    except ThreesError as exc:
        raise fail(exc, 3) from None


def query_snapshot(config: Path, snapshot: str, key: list[str], as_of: str | None) -> None:
    """``threes query``: print one key of a snapshot as JSON.

    Exit codes: 0 the key is found; 1 the snapshot has no such key; 2 a bad query (an unknown
    snapshot, a malformed key or ``--as-of``, or ``as_of`` on a snapshot without versions); 3 the
    snapshot cannot be queried now (503) or the config or Kafka failed.

    Asks a running ``threes serve`` of this pipeline (started from the same folder) when there is
    one; else loads the snapshot as the job does, from its newest checkpoint plus the topics' tail, in
    a SparkSession of its own (``local[1]``), reading the checkpoint location only.
    """
    from stream_app.session import spark_session
    from stream_app.snapshot.offline_query import query_offline
    from stream_app.snapshot.query_keys import QueryError
    from threes.console import fail
    from threes.local.stack import resolved_spark_jars

    pipeline = _stream(config)
    stream = pipeline.stream
    names = sorted(s.name for s in stream.snapshots)
    if snapshot not in names:  # before a SparkSession takes seconds to start
        raise fail(ThreesError(f"{config}: no snapshot {snapshot!r} in stream.snapshots (have: {names})"), 2)
    served = _query_served(stream, snapshot, key, as_of)
    if served is not None:
        code, doc = served
        typer.echo(json.dumps(doc, indent=2))
        if code != 200:
            raise typer.Exit(1 if code == 404 else 2 if code < 500 else 3)
        return
    settings = stream.spark.model_copy(update={"master": "local[1]", "app_name": "threes-query"})
    spark = None
    try:
        spark = spark_session(settings, resolved_spark_jars(), _s3a_jars(stream.checkpoint_location))
        code, doc = query_offline(stream, pipeline.kafka, spark, config.parent, snapshot, key, as_of)
    except QueryError as exc:
        raise fail(ThreesError(str(exc)), 2 if exc.status < 500 else 3) from None
    except ConfigError as exc:
        from kernel.config.loader import locate

        raise fail(ConfigError(locate(exc.problems, config)), 3) from None
    except ThreesError as exc:
        raise fail(exc, 3) from None
    finally:
        if spark is not None:
            _stop_spark(spark)
    typer.echo(json.dumps(doc, indent=2))
    if code != 200:
        raise typer.Exit(1 if code == 404 else 2 if code < 500 else 3)
