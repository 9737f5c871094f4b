"""Elasticsearch: ``ElasticsearchSource`` and ``ElasticsearchSink``."""
