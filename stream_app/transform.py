"""``stream.transform``: a user's function ``DataFrame -> DataFrame``, what the YAML cannot say.

The job applies it to every micro-batch after the lookups, derive columns and the stream's
``where``, before the update records are built (:meth:`stream_app.batch.BatchPlan.records`).
It receives the enriched events with the job's internal columns (names starting with
``__``: the event's Kafka key, headers, partition and offset, its original bytes and why it
is dead-lettered, :data:`INTERNAL_FIELDS`) and must keep them; the columns it adds are part
of the enriched event from then on (their Avro types follow Spark's,
:func:`stream_app.plan.spark_types.avro_of_spark`).

The reference is ``package.module:function``, the entry-point notation of Python packaging
(and of uvicorn's ``module:app``). The module is imported from the Python path, else from
the config file's folder.

:func:`load_transform` needs no JVM (``threes validate`` imports the function);
:func:`output_type` runs it once on an empty DataFrame at start-up, so its output schema is
known before the first micro-batch and checked against the update topics then.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

INTERNAL_PREFIX = "__"
"""Columns whose names start with it are the job's own (never part of the enriched event)."""

Transform = Callable[[Any], Any]
"""``pyspark.sql.DataFrame -> pyspark.sql.DataFrame``."""


def load_transform(ref: str, base_dir: Path | None = None) -> Transform:
    """Import the function ``package.module:function``.

    Args:
        ref: the reference (``stream.transform``; the config model checked its form).
        base_dir: the config file's folder: a module not on the Python path is looked for there
            (the folder is then added to ``sys.path``, for the driver's process).

    Returns:
        The function.

    Raises:
        ValueError: the module cannot be imported (not found, or its import raised: the
            exception's type and first line), has no such attribute, or it is not callable. The
            message is one line, for a :class:`~kernel.exceptions.ConfigError` at
            ``stream.transform``.
    """
    module_name, _, attr = ref.partition(":")
    top = module_name.split(".")[0]
    try:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            beside = base_dir is not None and ((base_dir / top).is_dir() or (base_dir / f"{top}.py").is_file())
            if not beside or exc.name != top:
                raise
            # a module next to the config, as `python -m` finds one in the working directory
            sys.path.insert(0, str(base_dir))
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        where = f", nor in {base_dir}" if base_dir is not None else ""
        raise ValueError(f"cannot import module {module_name!r}: no module named {exc.name!r} on the Python "
                         f"path{where} (install it, set PYTHONPATH, or put it next to the config file)") from exc
    except Exception as exc:  # the user's module failed to import: say how, in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"importing module {module_name!r} failed: {type(exc).__name__}: {first}") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"module {module_name!r} has no function {attr!r}")
    if not callable(fn):
        raise ValueError(f"{ref!r} is a {type(fn).__name__}, not a function DataFrame -> DataFrame")
    return fn


def internal_fields(timestamp: bool) -> list[Any]:
    """The internal columns every enriched micro-batch carries into the transform (Spark fields).

    They are the columns :meth:`stream_app.batch.BatchPlan.frame` makes of Spark's Kafka rows
    (with their Kafka source types): ``__key``, ``__headers``, ``__partition``, ``__offset``,
    ``__timestamp`` (when a projection's version is the Kafka timestamp), ``__value`` (the original
    bytes, kept for dead letters) and ``__error`` (why the event is dead-lettered, null when fine).

    Args:
        timestamp: whether ``__timestamp`` is among them.
    """
    from pyspark.sql import types as T

    header = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])
    fields = [
        T.StructField("__key", T.BinaryType()),
        T.StructField("__headers", T.ArrayType(header)),
        T.StructField("__partition", T.IntegerType()),
        T.StructField("__offset", T.LongType()),
    ]
    if timestamp:
        fields.append(T.StructField("__timestamp", T.TimestampType()))
    return [*fields, T.StructField("__value", T.BinaryType()), T.StructField("__error", T.StringType())]


def output_type(spark: Any, enriched: Any, fn: Transform, internal: list[Any]) -> Any:
    """What ``fn`` makes of a micro-batch: run once on an empty DataFrame, at the job's start.

    Spark analyzes the transform's plan without data, so a column it reads that is not
    there, or an expression of the wrong type, fails here, with Spark's message.

    Args:
        spark: the SparkSession.
        enriched: the enriched event's Spark type (a ``StructType``, before the transform).
        fn: the transform.
        internal: the internal columns (:func:`internal_fields`).

    Returns:
        The output's ``StructType``, internal columns included.

    Raises:
        ValueError: ``fn`` raised (its exception's type and first line), returned no DataFrame,
            or dropped internal columns (named).
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import types as T

    frame = spark.createDataFrame([], T.StructType([*internal, *enriched.fields]))
    try:
        out = fn(frame)
        schema = out.schema if isinstance(out, DataFrame) else None
    except Exception as exc:  # the user's code or Spark's analyzer says what is wrong
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"the function raised {type(exc).__name__}: {first}") from exc
    if schema is None:
        raise ValueError(f"the function returned a {type(out).__name__}, not a DataFrame")
    dropped = [f.name for f in internal if f.name not in schema.fieldNames()]
    if dropped:
        raise ValueError(f"the function dropped the internal columns {dropped}: keep every column whose name "
                         f"starts with '__' (they carry the Kafka metadata and the dead-letter routing)")
    return schema
