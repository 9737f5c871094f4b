"""The source connector runtime: worker, offsets store, supervision (Kafka Connect-style; the API is connectors.api)."""
