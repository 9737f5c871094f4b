"""``threes dlq list|show|replay CONFIG``: list dead letters, see why, send them back once the cause is fixed.

The dead letter topics are those CONFIG names (each sync service's and the stream job's
``dead_letter_topic``), or ``--dlq TOPIC``. A dead letter is named ``<dlq topic>:<partition>:<offset>``
(the ``id`` column of ``list``). Reading commits nothing; ``replay`` produces the selected records back
to their original topic and partition (or ``--to TOPIC``) and records what it replayed, so the same
records are not replayed twice by mistake (see :mod:`threes.dead_letters`).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from kernel.exceptions import ThreesError
from kernel.redact import redact
from threes.console import ConfigArg, console, fail, load, out

dlq_app = typer.Typer(help="List, show and replay the dead letters of the config's dead letter topics.",
                      no_args_is_help=True)

DlqOpt = Annotated[list[str] | None, typer.Option("--dlq", help="read this dead letter topic (repeatable); default: "
                                                                 "every dead_letter_topic of CONFIG")]
ReasonOpt = Annotated[str | None, typer.Option("--reason", "-r", help="part of the reason (error class: message), "
                                                                      "any case")]
TopicOpt = Annotated[str | None, typer.Option("--topic", "-t", help="original topic of the records")]
SinceOpt = Annotated[str | None, typer.Option("--since", help="dead-lettered at or after: ISO 8601 (UTC unless "
                                                              "zoned) or an age (15m, 2h, 3d)")]
UntilOpt = Annotated[str | None, typer.Option("--until", help="dead-lettered before: ISO 8601 or an age")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (for scripts)")]


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _selected(config: Any, dlq: list[str] | None, reason: str | None, topic: str | None, since: str | None,
              until: str | None, ids: list[str] | None = None) -> tuple[Any, list[Any]]:
    from threes.dead_letters import dead_letter_topics, parse_time, read_letters, select_letters

    pipeline = load(config)
    try:
        since_ms = parse_time(since) if since else None
        until_ms = parse_time(until) if until else None
        topics = list(dlq or [])
        for letter_id in ids or []:
            topics.append(_split_id(letter_id)[0])
        topics = list(dict.fromkeys(topics)) or dead_letter_topics(pipeline)
        if not topics:
            raise ThreesError(f"{config} names no dead letter topic (no sync service, no stream job): use --dlq")
        letters = read_letters(pipeline.kafka, topics, since_ms=since_ms)
    except ThreesError as exc:
        raise fail(exc) from None
    return pipeline, select_letters(letters, reason=reason, topic=topic, since_ms=since_ms, until_ms=until_ms,
                                    ids=ids or ())


def _split_id(letter_id: str) -> tuple[str, int, int]:
    parts = letter_id.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise ThreesError(f"{letter_id!r} is not a dead letter id: <dlq topic>:<partition>:<offset> (threes dlq list)")
    return parts[0], int(parts[1]), int(parts[2])


def _summary(letter: Any, replayed: dict[str, Any]) -> dict[str, Any]:
    c = letter.context
    return {
        "id": letter.id,
        "dead_lettered_at": _when(letter.timestamp_ms),
        "topic": c.topic if c else None,
        "partition": c.partition if c else None,
        "offset": c.offset if c else None,
        "stage": c.stage if c else None,
        "component": c.component if c else None,
        "reason": letter.reason,
        "replayed": replayed.get(letter.id),
    }


@dlq_app.command("list")
def list_(config: ConfigArg, dlq: DlqOpt = None, reason: ReasonOpt = None, topic: TopicOpt = None,
          since: SinceOpt = None, until: UntilOpt = None, as_json: JsonOpt = False) -> None:
    """List dead letters (id, when, original record, stage, reason, replayed), with counts by topic and reason."""
    from threes.dead_letters import replayed_ids

    pipeline, letters = _selected(config, dlq, reason, topic, since, until)
    try:
        replayed = replayed_ids(pipeline.kafka)
    except ThreesError as exc:
        raise fail(exc) from None
    rows = [_summary(letter, replayed) for letter in letters]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{len(rows)} dead letter(s)", title_justify="left")
    for name in ("id", "dead-lettered at", "record", "stage", "reason", "replayed"):
        table.add_column(name, overflow="fold")
    for r in rows:
        record = f"{r['topic']}[{r['partition']}]@{r['offset']}" if r["topic"] else "?"
        reason_text = r["reason"] if len(r["reason"]) <= 160 else r["reason"][:157] + "..."
        done = f"to {r['replayed']['to']} at {r['replayed']['at']}" if r["replayed"] else ""
        table.add_row(r["id"], r["dead_lettered_at"], record, r["stage"] or "", reason_text, done)
    out.print(table)
    counts = Counter((r["topic"], r["reason"].split(":", 1)[0]) for r in rows)
    for (t, error_class), n in counts.most_common():
        out.print(f"{n:>6}  {t}  {error_class}", highlight=False, soft_wrap=True)


@dlq_app.command("show")
def show(config: ConfigArg, letter_id: Annotated[str, typer.Argument(help="<dlq topic>:<partition>:<offset>",
                                                                     show_default=False)],
         as_json: JsonOpt = False) -> None:
    """Show one dead letter: its headers, the reason in full, its key and value decoded (else hex)."""
    from schemas.serde import AvroDeserializer
    from schemas.store import SchemaStore
    from threes.dead_letter_values import decode, jsonable
    from threes.dead_letters import replayed_ids

    try:
        _split_id(letter_id)
    except ThreesError as exc:
        raise fail(exc) from None
    pipeline, letters = _selected(config, None, None, None, None, None, ids=[letter_id])
    if not letters:
        raise fail(ThreesError(f"no dead letter {letter_id} (threes dlq list shows the ids)"))
    letter = letters[0]
    try:
        from kernel.kafka.topics import internal_topic_options

        store = SchemaStore(pipeline.kafka.librdkafka_config(), pipeline.kafka.schema_topic,
                            **internal_topic_options(pipeline.kafka))
        deserializer: Any = AvroDeserializer(store)
        if pipeline.kafka.schema_registry is not None:  # values written in the Confluent wire format too
            from schemas.registry import RegistryBridge, registry_client
            from threes.dead_letter_values import registry_decoder

            client = registry_client(pipeline.kafka.schema_registry.client_config())
            deserializer = registry_decoder(deserializer, RegistryBridge(client, store))
        replayed = replayed_ids(pipeline.kafka)
    except ThreesError as exc:
        console.print(f"[yellow]warning[/yellow] {exc}: values shown as hex", highlight=False, soft_wrap=True)
        deserializer, replayed = None, {}
    key_as, key = decode(letter.key, deserializer)
    value_as, value = decode(letter.value, deserializer)
    if "value" in letter.omitted and letter.context is not None:  # larger than the dead letter topic takes
        ctx = letter.context
        value_as, value = "omitted", (f"left out of the dead letter ({ctx.original_bytes} bytes with the key); the "
                                      f"original is {ctx.topic}[{ctx.partition}]@{ctx.offset}, which replay reads")
    doc = {**_summary(letter, replayed),
           "headers": {k: redact(v.decode(errors="replace")) for k, v in letter.headers},
           "key": {"as": key_as, "value": key}, "value": {"as": value_as, "value": value}}
    doc = jsonable(doc)
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    table = Table(title=letter.id, title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("", overflow="fold")
    for k in ("dead_lettered_at", "topic", "partition", "offset", "stage", "component", "reason", "replayed"):
        table.add_row(k, str(doc[k]) if doc[k] is not None else "")
    for k, v in doc["headers"].items():
        table.add_row(f"header {k}", v)
    table.add_row(f"key ({key_as})", json.dumps(doc["key"]["value"]))
    table.add_row(f"value ({value_as})", json.dumps(doc["value"]["value"], indent=2))
    out.print(table)


@dlq_app.command("replay")
def replay(
    config: ConfigArg,
    dlq: DlqOpt = None,
    reason: ReasonOpt = None,
    topic: TopicOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    ids: Annotated[list[str] | None, typer.Option("--id", help="replay this dead letter (repeatable)")] = None,
    all_: Annotated[bool, typer.Option("--all", help="replay every dead letter of the topics (no filter)")] = False,
    to: Annotated[str | None, typer.Option("--to", help="produce to this topic instead of each record's original "
                                                         "topic and partition")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list what would be sent; send and record nothing")] = (
        False),
    force: Annotated[bool, typer.Option("--force", help="replay dead letters that were replayed before")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Send selected dead letters back to their original topic (or --to), once the cause is fixed.

    Each record goes back with its key, value and original headers, its version among them: every sink
    applies it only if it is newer than what the target holds, so a replay never overwrites newer data.
    What was replayed is recorded (topic _threes_dlq_replays); replaying the same dead letters again is
    refused unless --force.
    """
    from threes.dead_letter_originals import with_originals
    from threes.dead_letters import IDEMPOTENCE_NOTE
    from threes.dead_letters import replay as do_replay

    if not (all_ or dlq or reason or topic or since or until or ids):
        raise fail(ThreesError("select the dead letters to replay (--id, --reason, --topic, --since, --until, "
                               "--dlq) or say --all"))
    try:
        for letter_id in ids or []:
            _split_id(letter_id)
    except ThreesError as exc:
        raise fail(exc) from None
    pipeline, letters = _selected(config, dlq, reason, topic, since, until, ids=ids)
    try:
        # a dead letter written without its value (dlq.omitted) is replayed from its original
        letters = with_originals(pipeline.kafka, letters) if not dry_run else letters
        result = do_replay(pipeline.kafka, letters, to=to, dry_run=dry_run, force=force)
    except ThreesError as exc:
        raise fail(exc) from None
    rows = [{"id": i, "to": t, "partition": p, "offset": o} for i, t, p, o in result.sent]
    if as_json:
        print(json.dumps({"dry_run": dry_run, "replayed": rows, "note": IDEMPOTENCE_NOTE}, indent=2))
        return
    verb = "would replay" if dry_run else "replayed"
    table = Table(title=f"{verb} {len(rows)} dead letter(s)", title_justify="left")
    for name in ("id", "to", "partition", "offset"):
        table.add_column(name)
    for letter_id, to, partition, offset in result.sent:
        table.add_row(letter_id, to, "" if partition < 0 else str(partition), "" if offset < 0 else str(offset))
    out.print(table)
    console.print(f"note: {IDEMPOTENCE_NOTE}", highlight=False, soft_wrap=True)
