"""Dead letter keys and values shown to a person (``threes dlq show``): Avro decoded, else hex.

The bytes are the original record's (:mod:`kernel.dlq`): single-object Avro of the schema store,
or the Confluent wire format when a Schema Registry is configured (:func:`registry_decoder`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)


def decode(data: bytes | None, deserializer: Any) -> tuple[str, Any]:
    """``("avro", value)`` decoded with the schema store, ``("hex", text)`` when it cannot be, ``("null", None)``."""
    if data is None:
        return "null", None
    if deserializer is not None:
        try:
            return "avro", deserializer(data)
        except Exception:  # not our encoding, an unknown schema: the bytes are still shown
            log.debug("value not decoded", exc_info=True)
    return "hex", data.hex()


CONFLUENT_MAGIC = b"\x00"


def registry_decoder(deserializer: Any, bridge: Any) -> Any:
    """A decoder for :func:`decode` that also reads the Confluent wire format (magic byte 0, schema id).

    Args:
        deserializer: the single-object decoder (``schemas.serde.AvroDeserializer`` over the store).
        bridge: a :class:`schemas.registry.RegistryBridge`: it fetches the writer schema of a Confluent
            prefix from the registry and turns the bytes into single-object ones.

    Returns:
        ``bytes -> value``: Confluent-framed bytes through the registry, others as before.
    """

    def read(data: bytes) -> Any:
        if data[:1] == CONFLUENT_MAGIC and len(data) >= 5:
            return deserializer(bridge.to_single_object(data))
        return deserializer(data)

    return read


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types: bytes as hex, other non-JSON values (Decimal, datetime) as ``str``."""
    return json.loads(json.dumps(value, default=lambda v: v.hex() if isinstance(v, bytes) else str(v)))
