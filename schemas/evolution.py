"""What a source does with its writer schemas when it starts: check them, then record them as versions.

A source's topic has two subjects, ``<topic>-key`` and ``<topic>-value``
(Confluent's ``TopicNameStrategy``). On start the source checks both before it
produces anything (:func:`plan_topic_schemas`):

* the **value** schema must be compatible with the subject's versions at the
  topic's level (:mod:`schemas.compatibility`, ``BACKWARD`` by default);
* the **key** schema must not change at all: other key bytes for the same
  entity make a second entity in a compacted topic. A change is refused
  (:class:`~schemas.exceptions.KeySchemaChangeError`) unless the source asks
  for a re-key; the plan then says ``rekey`` and the runner tombstones the old
  keys, re-snapshots, and only then records the new key version
  (:meth:`TopicSchemaPlan.record_key`), so a crash half-way re-keys again.

A subject with no versions yet (a new topic, or a topic written before
versions were recorded) accepts any value schema as its version 1; a key
schema only when the topic's latest keys (if any) carry its fingerprint. A key schema
that a release before the logical canonical form stored under its Parsing
Canonical Form fingerprint keeps that fingerprint in its keys
(:func:`legacy_key_fingerprint`): upgrading never changes a key's bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas.compatibility import Compatibility, check_compatibility
from schemas.exceptions import KeySchemaChangeError, UnknownSchemaError
from schemas.serde import HEADER_BYTES, MARKER, Schema, canonical_form, fingerprint, parsing_fingerprint


def key_subject(topic: str) -> str:
    """The subject of a topic's key schemas: ``<topic>-key``."""
    return f"{topic}-key"


def value_subject(topic: str) -> str:
    """The subject of a topic's value schemas: ``<topic>-value``."""
    return f"{topic}-value"


def _field_types(schema: Any) -> dict[str, str]:
    return {f["name"]: canonical_form(f["type"] if not isinstance(f["type"], str) else f["type"])
            for f in schema.get("fields", [])} if isinstance(schema, dict) else {}


def describe_change(old: Schema, new: Schema) -> list[tuple[str, str]]:
    """The fields that differ between two record schemas, for an error message.

    Returns:
        ``(field, change)`` pairs such as ``("id", 'type "int" -> "long"')``;
        ``("<root>", ...)`` when only the record itself differs (its name).
    """
    o = json.loads(old) if isinstance(old, str) else old
    n = json.loads(new) if isinstance(new, str) else new
    try:
        before, after = _field_types(o), _field_types(n)
    except Exception:  # a named type used by reference: fall back to the whole schema
        before, after = {}, {}
    out: list[tuple[str, str]] = []
    for name, t in after.items():
        if name not in before:
            out.append((name, f"added ({t})"))
        elif before[name] != t:
            out.append((name, f"type {before[name]} -> {t}"))
    out += [(name, "removed") for name in before if name not in after]
    return out or [("<root>", f"{canonical_form(old)} -> {canonical_form(new)}")]


@dataclass
class TopicSchemaPlan:
    """The checked schemas of a topic, ready to be recorded as versions.

    Attributes:
        topic: the topic.
        key_schema / value_schema: the new schemas.
        rekey: the key schema differs from the subject's latest version and a
            re-key was asked for: the old keys must be tombstoned and the source
            re-snapshotted before :meth:`record_key`.
        key_fingerprint: the fingerprint keys are framed with. Normally
            ``fingerprint(key_schema)``; for a topic whose keys were written
            before the logical canonical form, the Parsing Canonical Form
            fingerprint they carry (:func:`legacy_key_fingerprint`), so an
            upgrade never changes a key's bytes.
        old_key_fingerprints: the fingerprints of the key subject's versions
            (the keys to tombstone are framed with one of them, or with a
            fingerprint written before versions were recorded).
    """

    topic: str
    key_schema: Schema
    value_schema: Schema
    key_fingerprint: bytes
    rekey: bool = False
    old_key_fingerprints: list[bytes] = field(default_factory=list)

    def record_value(self, store: Any) -> int:
        """Append the value schema to ``<topic>-value`` (no-op when it is the latest). Returns the version."""
        return int(store.add_version(value_subject(self.topic), self.value_schema))

    def record_key(self, store: Any) -> int:
        """Append the key schema to ``<topic>-key`` (no-op when it is the latest). Returns the version."""
        return int(store.add_version(key_subject(self.topic), self.key_schema, self.key_fingerprint))


def _same_schema(store: Any, fp: bytes, schema: Schema) -> bool:
    """Whether ``fp`` is stored with a schema that decodes exactly like ``schema``."""
    try:
        stored = store.get_json(fp)
    except UnknownSchemaError:
        return False
    return canonical_form(stored) == canonical_form(schema)


def _known(store: Any, fp: bytes) -> bool:
    try:
        store.get_json(fp)
    except UnknownSchemaError:
        return False
    return True


def legacy_key_fingerprint(store: Any, key_schema: Schema) -> bytes | None:
    """The fingerprint keys of ``key_schema`` were framed with before the logical canonical form, if it differs.

    Releases before it fingerprinted the Parsing Canonical Form, which differs
    from today's only for schemas with logical types. Key bytes are an
    entity's identity in a compacted topic, so a key schema stored under its
    old fingerprint (with exactly this schema: a colliding schema stored first
    does not count) keeps being written under it.

    Returns:
        The old fingerprint, or ``None`` when it equals today's or is not stored.
    """
    old = parsing_fingerprint(key_schema)
    if old != fingerprint(key_schema) and _same_schema(store, old, key_schema):
        return old
    return None


def _rekey_or_refuse(
    plan: TopicSchemaPlan, connector: str, change: list[tuple[str, str]], rekey: bool, tasks: int, old: list[bytes]
) -> None:
    if not rekey:
        raise KeySchemaChangeError(plan.topic, connector, change)
    if tasks > 1:
        raise KeySchemaChangeError(
            plan.topic, connector, change,
            f"a re-key runs as one task: run the source once with `tasks: 1` (it has {tasks}), then restore it",
        )
    plan.rekey = True
    plan.old_key_fingerprints = old


def plan_topic_schemas(
    store: Any,
    *,
    topic: str,
    connector: str,
    key_schema: Schema,
    value_schema: Schema,
    compatibility: Compatibility | str = Compatibility.BACKWARD,
    rekey: bool = False,
    tasks: int = 1,
    topic_keys: Callable[[], Iterable[bytes]] | None = None,
) -> TopicSchemaPlan:
    """Check a source's key and value schemas against the topic's subjects; register nothing.

    Args:
        store: a schema store with subject versions (:class:`~schemas.store.SchemaStore`).
        topic: the source's topic.
        connector: the source's name (named in errors).
        key_schema: the key schema the source will write.
        value_schema: the value schema it will write.
        compatibility: the value subject's level.
        rekey: whether a key schema change is allowed (as a re-key).
        tasks: how many tasks the source runs. A re-key needs one: the first task
            done would record the new key version, and a task starting after it
            would not re-snapshot its share of the entities whose old keys were
            tombstoned.
        topic_keys: returns some keys already in the topic (its latest records,
            :func:`kernel.kafka.topics.recent_keys`); asked only when the key
            subject has no version yet, so a topic written before versions were
            recorded (or whose versions were lost) is not re-keyed silently.

    Returns:
        The plan; ``plan.rekey`` tells the caller to re-key before recording the key.

    Raises:
        KeySchemaChangeError: the key schema changed and ``rekey`` is off, or
            on with more than one task.
        IncompatibleSchemaError: the value schema breaks the compatibility level.
    """
    plan = TopicSchemaPlan(topic, key_schema, value_schema, fingerprint(key_schema))
    key_versions = store.versions(key_subject(topic))
    if key_versions and _same_schema(store, key_versions[-1], key_schema):
        plan.key_fingerprint = key_versions[-1]  # unchanged (perhaps framed with an old fingerprint)
    elif key_versions:
        change = describe_change(store.get_json(key_versions[-1]), key_schema)
        _rekey_or_refuse(plan, connector, change, rekey, tasks, list(key_versions))
    else:
        _plan_unversioned_key(store, plan, connector, key_schema, rekey, tasks, topic_keys)
    check_compatibility(
        value_schema,
        store.version_schemas(value_subject(topic)),
        compatibility,
        topic=topic,
        subject=value_subject(topic),
    )
    return plan


def _plan_unversioned_key(
    store: Any,
    plan: TopicSchemaPlan,
    connector: str,
    key_schema: Schema,
    rekey: bool,
    tasks: int,
    topic_keys: Callable[[], Iterable[bytes]] | None,
) -> None:
    """:func:`plan_topic_schemas` for a key subject without versions: judged by the keys already in the topic.

    The key fingerprint becomes the one the topic's keys are framed with (the plan's, or a legacy one);
    keys framed with another schema are a key change (re-key or refuse).
    """
    legacy = legacy_key_fingerprint(store, key_schema)
    framed = {bytes(k[2:HEADER_BYTES]) for k in (topic_keys() if topic_keys else ()) if k[:2] == MARKER}
    if not framed:  # a new or empty topic (or nothing to look at)
        plan.key_fingerprint = legacy or plan.key_fingerprint
    elif plan.key_fingerprint in framed:
        pass
    elif legacy is not None and legacy in framed:
        plan.key_fingerprint = legacy
    else:
        known = [fp for fp in sorted(framed) if _known(store, fp)]
        change = (describe_change(store.get_json(known[0]), key_schema) if known
                  else [("<root>", f"the topic's keys carry fingerprint(s) {sorted(f.hex() for f in framed)}")])
        _rekey_or_refuse(plan, connector, change, rekey, tasks, sorted(framed))
