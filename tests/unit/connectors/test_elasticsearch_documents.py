"""Elasticsearch documents written in columns are the bytes the client writes per value dict."""

from __future__ import annotations

import copy

from elasticsearch import OrjsonSerializer

from connectors.elasticsearch.sink import _json_safe
from schemas.columnar import ColumnarDecoder
from schemas.documents import documents
from schemas.serde import AvroDeserializer, split
from tests.unit.test_columnar import EVERY_TYPE, encode, every_value


def _table_and_messages(schema: dict, n: int = 30):
    names = {f["name"] for f in schema["fields"]}
    values = [{k: v for k, v in every_value(i).items() if k in names} for i in range(n)]
    values[3]["f"], values[4]["d"] = float("nan"), float("inf")
    store, fp, messages = encode(schema, values)
    return store, ColumnarDecoder(store).decode(fp, [split(m)[1] for m in messages]), messages


def test_documents_are_byte_identical_to_the_clients_serializer() -> None:
    schema = copy.deepcopy(EVERY_TYPE)
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "r"]  # r nests fixed/decimal: per record
    store, table, messages = _table_and_messages(schema)
    docs = documents(table)
    assert docs is not None and len(docs) == len(messages)
    serializer, deserializer = OrjsonSerializer(), AvroDeserializer(store)
    assert docs == [serializer.dumps(_json_safe(deserializer(m))) for m in messages]


def test_a_nested_type_that_needs_conversion_falls_back_to_per_record() -> None:
    _store, table, _messages = _table_and_messages(EVERY_TYPE)
    assert documents(table) is None
