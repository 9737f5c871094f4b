"""Column expressions built once per job, not once per micro-batch.

Every ``pyspark.sql.functions`` call goes through py4j: one ``f.col(name)`` is
several round trips to the driver's JVM, and ``df.select`` of column *names* costs
several times a select of ready ``Column`` objects, so a micro-batch plan rebuilt
from scratch spends a good share of its time (``plan_s`` of the batch log line) in
such calls. Unresolved column expressions (built from names, not
from one DataFrame's attributes) can be reused by every later plan, so the plan
builders keep them in a :class:`ColumnCache`, keyed by everything they depend on.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


class ColumnCache:
    """Column expressions (or lists of them) by key, built on first use.

    Not thread-safe; one per job (``foreachBatch`` runs one micro-batch at a time).
    Entries live as long as the job: keys must name a bounded set (a lookup, an
    engine, a column list), never a per-batch value.
    """

    def __init__(self) -> None:
        self._entries: dict[Hashable, Any] = {}

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The entry for ``key``, from ``build()`` the first time."""
        found = self._entries.get(key)
        if found is None:
            found = self._entries[key] = build()
        return found

    def col(self, name: str) -> Any:
        """``pyspark.sql.functions.col(name)``, built once."""
        from pyspark.sql import functions as f

        return self.get(("col", name), lambda: f.col(name))

    def cols(self, names: list[str] | tuple[str, ...]) -> list[Any]:
        """``col`` of each name, in order."""
        return [self.col(n) for n in names]

    def select(self, df: Any, columns: list[Any]) -> Any:
        """``df.select(*columns)``, the column list turned into a JVM ``Seq`` once.

        py4j turns a Python list into a Java list one element at a time, a round trip
        each; a ``Seq`` kept from an earlier batch is one round trip (what is left is the
        JVM's analysis).
        ``columns`` must be this cache's own entries (the same objects every batch):
        the entry is keyed by their identities and holds them, so the key stays theirs.
        Falls back to ``df.select`` for a DataFrame without a JVM peer (Spark Connect).
        """
        jdf, jcols = getattr(df, "_jdf", None), getattr(df, "_jcols", None)
        if jdf is None or jcols is None:
            return df.select(*columns)
        _held, seq = self.get(("select", tuple(map(id, columns))), lambda: (list(columns), jcols(*columns)))
        return type(df)(jdf.select(seq), df.sparkSession)

    def join(self, df: Any, other: Any, on: str, how: str) -> Any:
        """``df.join(other, on, how)`` on one column name, the JVM ``Seq`` of ``[on]`` built once.

        PySpark turns ``[on]`` into a ``Seq`` through ``PythonUtils``, which py4j
        finds by trying the name in each imported package: a failing class lookup
        (a scan of the driver's class path) per package, every micro-batch. Falls
        back to ``df.join`` for a DataFrame without a JVM peer (Spark Connect).
        """
        jdf, jseq = getattr(df, "_jdf", None), getattr(df, "_jseq", None)
        other_jdf = getattr(other, "_jdf", None)
        if jdf is None or jseq is None or other_jdf is None:
            return df.join(other, on, how)
        seq = self.get(("join-on", on), lambda: jseq([on]))
        return type(df)(jdf.join(other_jdf, seq, how), df.sparkSession)

    def __len__(self) -> int:
        return len(self._entries)


def rows_where(df: Any, condition: Any, columns: list[Any]) -> Any:
    """The rows of ``df`` where ``condition`` is true, as ``columns``: a generator, not a filter.

    Spark's optimizer pushes a filter below the projections under it and copies
    the expressions of the columns it reads into the predicate, whatever they
    cost: a filter on a decoded struct decoded every record again per field
    the check reads (8 ``from_avro`` calls a record for 5 fields), and an inner
    lookup's filter evaluated the lookup's pandas UDF a second time. A
    generator (``inline`` of a one-element array, null where ``condition`` is
    not true) is not crossed by that rule, so each expression below runs once.

    Args:
        df: the DataFrame.
        condition: a boolean column of ``df``; null counts as false, as in a filter.
        columns: the output columns (names, ``"struct.*"`` or named columns).

    Returns:
        A DataFrame of ``columns``, one row per row of ``df`` where ``condition`` holds.
    """
    from pyspark.sql import functions as f

    return df.select(f.inline(f.when(condition, f.array(f.struct(*columns)))))
