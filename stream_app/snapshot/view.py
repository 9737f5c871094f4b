"""What one micro-batch joins against: :class:`SnapshotView`, a snapshot's base and overlay at known offsets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from stream_app.snapshot.arrow_tables import ipc_bytes
from stream_app.snapshot.data import DELETED, LH, LK, lookup_key


def _f() -> Any:
    from pyspark.sql import functions

    return functions


@dataclass
class SnapshotView:
    """What one micro-batch joins against: a base and an overlay of newer changes, at known offsets.

    Attributes:
        name: the snapshot's name.
        key_type: Spark type of the key fields (the event side renders its
            lookup key against it).
        value_type: Spark type of the value fields (the joined columns).
        offsets: the next offset per topic-partition this view covers.
        mode: ``"broadcast"`` (base a small cached DataFrame, joined by Spark's
            broadcast hash join), ``"indexed"`` (base in an Arrow broadcast
            variable, looked up in the Python workers' cached index) or
            ``"partitioned"`` (base a cached DataFrame partitioned by ``__lk``,
            joined by Spark's shuffle join).
        base_rows: keys in the base.
        token: identity of the base (workers cache one index per token).
        broadcast: the Spark broadcast of the base as Arrow IPC bytes (indexed mode).
        base_df: the base as a cached DataFrame (broadcast and partitioned modes).
        overlay: changes newer than the base, one row per key, ``__lk, __lh,
            __deleted`` + value fields; a deleted row hides the base row.
        lookup_files: partitioned mode: the local folder of the version's
            lookup files (:mod:`stream_app.snapshot.mapped`), searched per event
            by the Python workers instead of a join; ``None``: Spark joins.
        partitions: partitioned mode: the base's buckets.
        versions: a versioned snapshot (``retention``): its versions as of this
            view (:class:`~stream_app.snapshot.as_of_join.VersionsView`), what
            ``as_of`` lookups join; ``None`` otherwise.
        jvm: ``"jvm"`` mode (real-time mode, :mod:`stream_app.realtime`): the lookup UDF's name and the
            reader key (``None`` for string keys) and value schema JSON; the table lives in the executors'
            JVMs, the view holds no data.
    """

    name: str
    key_type: Any
    value_type: Any
    offsets: dict[str, dict[int, int]]
    mode: str
    base_rows: int
    token: str = ""
    broadcast: Any = None
    base_df: Any = None
    overlay: pa.Table | None = None
    lookup_files: str | None = None
    partitions: int = 0
    versions: Any = None
    jvm: tuple[str, str | None, str] | None = None
    _overlay_ipc: bytes | None = field(default=None, repr=False)
    _overlay_df: Any = field(default=None, repr=False)

    @property
    def overlay_rows(self) -> int:
        """Rows in the overlay."""
        return 0 if self.overlay is None else self.overlay.num_rows

    def overlay_ipc(self) -> bytes | None:
        """The overlay as Arrow IPC bytes (shipped with the lookup function), ``None`` when empty."""
        if self.overlay is not None and self.overlay_rows and self._overlay_ipc is None:
            self._overlay_ipc = ipc_bytes(self.overlay.select([LK, LH, DELETED, *self.value_type.fieldNames()]))
        return self._overlay_ipc

    def overlay_df(self, spark: Any) -> Any:
        """The overlay as a small DataFrame (Spark joins it by broadcast), ``None`` when empty."""
        if self.overlay is not None and self.overlay_rows and self._overlay_df is None:
            self._overlay_df = spark.createDataFrame(self.overlay.select([LK, DELETED, *self.value_type.fieldNames()]))
        return self._overlay_df

    @classmethod
    def from_dataframe(
        cls, spark: Any, name: str, rows: Any, key_fields: Sequence[str], mode: str = "broadcast"
    ) -> SnapshotView:
        """A view over a DataFrame of live rows (key fields + value fields), no overlay.

        For tests and one-off use: the runtime builds views from Kafka.

        Args:
            spark: the SparkSession.
            name: the snapshot's name.
            rows: one row per key, with the key fields and the value fields.
            key_fields: the key field names, in key order.
            mode: ``"broadcast"``, ``"indexed"`` or ``"partitioned"``.
        """
        import uuid

        from pyspark.sql import types as T

        f = _f()
        key_type = T.StructType([rows.schema[k] for k in key_fields])
        value_type = T.StructType([fld for fld in rows.schema.fields if fld.name not in key_fields])
        lk = lookup_key(f.struct(*key_fields), key_type)
        table = rows.select(lk.alias(LK), f.xxhash64(lk).alias(LH), *value_type.fieldNames())
        if mode == "indexed":
            arrow = table.toArrow()
            return cls(
                name,
                key_type,
                value_type,
                {},
                mode,
                arrow.num_rows,
                uuid.uuid4().hex,
                broadcast=spark.sparkContext.broadcast(ipc_bytes(arrow)),
            )
        if mode == "partitioned":
            table = table.repartition(int(spark.conf.get("spark.sql.shuffle.partitions")), LK).sortWithinPartitions(LK)
        base = table.cache()
        return cls(name, key_type, value_type, {}, mode, base.count(), base_df=base)
