"""The source connector runtime: base classes, worker, offsets store (Kafka Connect-style)."""
