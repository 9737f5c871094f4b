"""Kafka for every part: client defaults (:mod:`.clients`), topic administration (:mod:`.topics`), committed reads.

:mod:`.committed` reads a topic up to its high watermarks (latest value per key of a
compacted topic, committed offsets of a consumer group).
"""
