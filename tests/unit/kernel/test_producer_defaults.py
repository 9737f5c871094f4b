"""Every producer threes builds is idempotent with acks=all; its tuning defaults yield to ``kafka.client_config``."""

from __future__ import annotations

from kernel.config.models import KafkaConfig
from kernel.kafka import clients


def test_client_config_tunes_linger_and_compression_but_never_acks() -> None:
    plain = clients.producer_config(KafkaConfig(bootstrap_servers="127.0.0.1:1"))
    assert (plain["linger.ms"], plain["compression.type"], plain["acks"], plain["enable.idempotence"]) == (
        20,
        "lz4",
        "all",
        True,
    )
    tuned = KafkaConfig(
        bootstrap_servers="127.0.0.1:1",
        client_config={"linger.ms": 200, "compression.type": "zstd", "queue.buffering.max.messages": 500},
    )
    conf = clients.producer_config(tuned)
    # the documented tuning of kafka.client_config reaches the producer (it was overwritten by the defaults)
    assert (conf["linger.ms"], conf["compression.type"], conf["queue.buffering.max.messages"]) == (200, "zstd", 500)
    assert (conf["acks"], conf["enable.idempotence"]) == ("all", True)
    # an override of the caller still wins over both
    assert clients.producer_config(tuned, linger_ms=5)["linger.ms"] == 5
