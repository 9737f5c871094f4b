"""Avro schemas the job writes with, derived from the schemas it reads.

The enriched event schema is the event's reader schema plus, per lookup, the
snapshot value fields under the lookup's prefix (nullable for a left join).
Update records take a subset of the enriched fields. Named types (records,
enums, fixed) are written with full names and defined at their first use, as
the Avro specification requires; a snapshot's named types are moved into a
namespace of their own per lookup, so joining the same snapshot twice (origin
and destination airports) defines each type once per prefix and never clashes
with the event's own types.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})
TIMESTAMP_MICROS = {"type": "long", "logicalType": "timestamp-micros"}

AvroType = Any


def _fullname(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _namespace_of(fullname: str) -> str | None:
    return fullname.rsplit(".", 1)[0] if "." in fullname else None


def _collect(t: AvroType, ns: str | None, defs: dict[str, dict[str, Any]]) -> None:
    """Find every named type defined in ``t`` (full name -> definition)."""
    if isinstance(t, list):
        for branch in t:
            _collect(branch, ns, defs)
    elif isinstance(t, dict):
        kind = t["type"]
        if kind in NAMED:
            full = _fullname(t["name"], t.get("namespace", ns))
            defs[full] = t
            for field in t.get("fields", ()):
                _collect(field["type"], _namespace_of(full), defs)
        elif kind == "array":
            _collect(t["items"], ns, defs)
        elif kind == "map":
            _collect(t["values"], ns, defs)
        else:
            _collect(kind, ns, defs)


def _into(space: str) -> Callable[[str], str]:
    """A rename that moves a full name under the namespace ``space``."""
    return lambda name: f"{space}.{name}"


class _Emitter:
    """Copies types out of one source schema, renaming its named types.

    Args:
        source: the schema the types come from.
        rename: full name in ``source`` -> full name in the output.
        emitted: full names already defined in the output (shared between
            emitters writing into the same output schema).
    """

    def __init__(self, source: dict[str, Any], rename: Callable[[str], str], emitted: set[str]):
        self.defs: dict[str, dict[str, Any]] = {}
        _collect(source, None, self.defs)
        self.rename = rename
        self.emitted = emitted

    def _resolve(self, name: str, ns: str | None) -> str:
        full = _fullname(name, ns)
        if full not in self.defs and name in self.defs:  # a name in the null namespace
            return name
        if full not in self.defs:
            raise ValueError(f"Avro type {name!r} is referenced but not defined")
        return full

    def emit(self, t: AvroType, ns: str | None) -> AvroType:
        """Copy type ``t`` (read in namespace ``ns``) with full, renamed names."""
        if isinstance(t, str):
            return t if t in PRIMITIVES else self.named(self._resolve(t, ns))
        if isinstance(t, list):
            return [self.emit(branch, ns) for branch in t]
        kind = t["type"]
        if kind in NAMED:
            return self.named(_fullname(t["name"], t.get("namespace", ns)))
        if kind == "array":
            return {**t, "items": self.emit(t["items"], ns)}
        if kind == "map":
            return {**t, "values": self.emit(t["values"], ns)}
        return {**t, "type": self.emit(kind, ns)}

    def named(self, full: str) -> AvroType:
        """The definition of a named type at its first use, its name afterwards."""
        new = self.rename(full)
        if new in self.emitted:
            return new
        self.emitted.add(new)
        definition = self.defs[full]
        skip = ("name", "namespace", "fields", "aliases")
        out = {k: copy.deepcopy(v) for k, v in definition.items() if k not in skip}
        out["name"] = new
        if "fields" in definition:
            out["fields"] = [self.field(f, _namespace_of(full)) for f in definition["fields"]]
        return out

    def field(self, field: dict[str, Any], ns: str | None, name: str | None = None) -> dict[str, Any]:
        """Copy a record field (optionally renamed)."""
        out = {k: copy.deepcopy(v) for k, v in field.items() if k not in ("type", "aliases")}
        out["name"] = name or field["name"]
        out["type"] = self.emit(field["type"], ns)
        return out


def fields_of(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The top-level fields of a record schema by name.

    Raises:
        ValueError: ``schema`` is not a record.
    """
    if not isinstance(schema, dict) or schema.get("type") not in ("record", "error"):
        raise ValueError("expected an Avro record schema")
    return {f["name"]: f for f in schema["fields"]}


def nullable(field: dict[str, Any]) -> dict[str, Any]:
    """Make a field optional: ``["null", T]`` with default ``null`` (null first, as a null default needs)."""
    t = field["type"]
    branches = t if isinstance(t, list) else [t]
    branches = ["null", *(b for b in branches if b != "null")]
    return {**field, "type": branches, "default": None}


def is_optional(avro_type: AvroType) -> bool:
    """Whether a field type admits ``null``."""
    return avro_type == "null" or (isinstance(avro_type, list) and "null" in avro_type)


@dataclass(frozen=True)
class JoinedFields:
    """The snapshot fields one lookup adds to the enriched event.

    Attributes:
        prefix: prefix of the joined field names.
        value_schema: the snapshot's value (reader) schema, a record.
        fields: which of its fields; all when ``None``.
        optional: whether they may be null (a left join).
    """

    prefix: str
    value_schema: dict[str, Any]
    fields: Sequence[str] | None
    optional: bool


def _ident(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text) or "_"


def enriched_schema(event_schema: dict[str, Any], joins: Iterable[JoinedFields]) -> dict[str, Any]:
    """The schema of enriched events: the event's fields, then each lookup's prefixed fields.

    Args:
        event_schema: the events' reader schema (a record).
        joins: what each lookup adds, in lookup order.

    Returns:
        A record schema named ``<event name>Enriched`` in the event's namespace.

    Raises:
        ValueError: a joined field name collides with another field, or a
            requested snapshot field does not exist.
    """
    emitted: set[str] = set()
    event_ns = event_schema.get("namespace") or _namespace_of(event_schema["name"])
    event_name = event_schema["name"].rsplit(".", 1)[-1]
    base = _Emitter(event_schema, lambda n: n, emitted)
    emitted.add(_fullname(event_name, event_ns))  # the event record itself is replaced by the enriched one
    fields = [base.field(f, event_ns) for f in event_schema["fields"]]
    seen = {f["name"] for f in fields}
    for join in joins:
        space = f"threes.enriched.{_ident(join.prefix)}"
        emitter = _Emitter(join.value_schema, _into(space), emitted)
        value_ns = join.value_schema.get("namespace") or _namespace_of(join.value_schema["name"])
        available = fields_of(join.value_schema)
        for name in join.fields or list(available):
            if name not in available:
                raise ValueError(f"field {name!r} is not in snapshot schema {join.value_schema['name']}")
            out_name = f"{join.prefix}{name}"
            if out_name in seen:
                raise ValueError(f"joined field {out_name!r} collides with another field of the enriched event")
            seen.add(out_name)
            field = emitter.field(available[name], value_ns, out_name)
            fields.append(nullable(field) if join.optional else field)
    out = {"type": "record", "name": _fullname(f"{event_name}Enriched", event_ns), "fields": fields}
    if event_schema.get("doc"):
        out["doc"] = f"{event_schema['doc']} (enriched by the threes stream job)"
    return out


def with_derived(enriched: dict[str, Any], derived: dict[str, Any]) -> dict[str, Any]:
    """The enriched schema with the ``derive`` columns appended, in YAML order (each nullable).

    Args:
        enriched: from :func:`enriched_schema`.
        derived: column name -> Avro type.

    Raises:
        ValueError: a derived column's name is already a field of the enriched event.
    """
    if not derived:
        return enriched
    have = {f["name"] for f in enriched["fields"]}
    clash = sorted(n for n in derived if n in have)
    if clash:
        raise ValueError(f"derive column(s) {clash} collide with fields of the enriched event")
    fields = [nullable({"name": n, "type": t}) for n, t in derived.items()]
    return {**enriched, "fields": [*enriched["fields"], *fields]}


def subset_schema(
    source: dict[str, Any],
    field_names: Sequence[str],
    name: str,
    extra_fields: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A record of some fields of ``source`` (their named types copied along), then ``extra_fields``.

    Args:
        source: a record schema (e.g. the enriched schema).
        field_names: the fields to keep, in this order.
        name: full name of the new record.
        extra_fields: more fields (primitive or self-contained types), appended.

    Raises:
        ValueError: a field is not in ``source``.
    """
    available = fields_of(source)
    emitter = _Emitter(source, lambda n: n, set())
    ns = source.get("namespace") or _namespace_of(source["name"])
    fields = []
    for field_name in field_names:
        if field_name not in available:
            raise ValueError(f"field {field_name!r} is not in {source['name']}")
        fields.append(emitter.field(available[field_name], ns))
    return {"type": "record", "name": name, "fields": fields + [dict(f) for f in extra_fields]}


def record_name_for(topic: str, suffix: str) -> str:
    """A valid Avro full name for records of ``topic``: ``updates.orders`` -> ``threes.updates.updates_orders_Key``."""
    return f"threes.updates.{_ident(topic)}_{suffix}"


STRING_KEY_NAMESPACE = "threes.stringkey"
"""Namespace of the key schemas :func:`string_key_schema` makes (never written to Kafka)."""


def string_key_schema(snapshot: str, key_field: str) -> dict[str, Any]:
    """The key schema a snapshot with ``key_format: string`` is planned with.

    Such a topic's keys are plain UTF-8 bytes (Kafka Streams' ``Serdes.String()``),
    not Avro: the job renders each as a struct of one string field so that
    lookups, the lookup key and the plan treat it like a one-field Avro key.
    The schema only describes that struct; no record is encoded with it.

    Args:
        snapshot: the snapshot's name (gives the record its name).
        key_field: the field's name, the one lookups join on.
    """
    return {
        "type": "record",
        "name": f"{_ident(snapshot)}_StringKey",
        "namespace": STRING_KEY_NAMESPACE,
        "fields": [{"name": key_field, "type": "string"}],
    }


_NOT_ENCODED = frozenset({"name", "namespace", "doc", "aliases", "default", "order"})


def _encoded_shape(schema: Any) -> Any:
    """A schema without what the binary encoding ignores (names, docs, defaults)."""
    if isinstance(schema, dict):
        return {k: _encoded_shape(v) for k, v in schema.items() if k not in _NOT_ENCODED}
    if isinstance(schema, list):
        return [_encoded_shape(s) for s in schema]
    return schema


def same_encoding(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether a struct of the same named columns encodes to the same Avro binary body under both schemas.

    Avro's binary encoding writes the fields in order, each by its type alone:
    record and type names, docs and defaults are not written (Avro
    specification, "Binary Encoding"). So two records with the same fields
    (names, for the columns they are filled from) with the same types in the
    same order have interchangeable bodies, and one encoding can be framed
    under either writer schema's fingerprint. A named type defined in one and
    referenced by name in the other compares as different (a missed sharing,
    never a wrong one).
    """
    fa, fb = a.get("fields", []), b.get("fields", [])
    return len(fa) == len(fb) and all(
        x["name"] == y["name"] and _encoded_shape(x["type"]) == _encoded_shape(y["type"])
        for x, y in zip(fa, fb, strict=True)
    )
