"""Bulk requests of the Elasticsearch sink: one ``_bulk`` call, and the judgement of its items.

An item applied (2xx), already newer (409) or nothing to delete (404) is done; 429 and 413 items are sent
again (``item_retries``); 5xx items make the batch retriable; an error any document would get blocks the
sink; any other refusal is about the record's data (a :class:`RecordFailure`).
"""

from __future__ import annotations

import time
from typing import Any

from connectors.api.limiter import Limiter
from connectors.api.sink_records import RecordFailure, SinkRecord
from connectors.elasticsearch.config import ElasticsearchSinkConfig
from kernel.exceptions import (
    BatchRefusedError,
    FatalError,
    RetriableError,
    SinkBackpressureError,
    SinkBlockedError,
)
from kernel.redact import redact


class ElasticsearchItemError(Exception):
    """Elasticsearch refused one document of a bulk request (the item's status and reason)."""


class ElasticsearchThrottledError(ElasticsearchItemError):
    """Elasticsearch answered one document 429 (or 413) on every retry of ``item_retries``."""


# item errors any document would get: the index or cluster refuses writes, not this document
# (a write block or the flood-stage disk watermark, a closed or missing index, no privilege)
TARGET_ITEM_ERRORS = frozenset({
    "cluster_block_exception", "index_closed_exception", "index_not_found_exception", "security_exception",
})


class BulkRequests:
    """``_bulk`` requests and their items (a mixin of ``ElasticsearchSink``)."""

    config: ElasticsearchSinkConfig
    name: str  # the sink's
    client: Any  # an ``elasticsearch.Elasticsearch``
    limiter: Limiter

    def _bulk(self, chunk: list[tuple[SinkRecord, bytes]]) -> Any:
        """One ``_bulk`` request of ready NDJSON lines; the answer keeps only what is read (``filter_path``)."""
        from elasticsearch import ApiError, TransportError

        try:
            with self.limiter.slot(len(chunk)):
                return self.client.bulk(operations=b"".join(lines for _r, lines in chunk),
                                        filter_path="errors,items.*.status,items.*.error,items.*._id")
        except ApiError as exc:
            if exc.meta.status == 429:
                self.limiter.backpressure()
                raise SinkBackpressureError(2.0, f"sink {self.name!r}: Elasticsearch answered 429") from exc
            if exc.meta.status >= 500:
                raise RetriableError(f"sink {self.name!r}: Elasticsearch answered {exc.meta.status}: {exc}") from exc
            if exc.meta.status == 413:  # the request is over http.max_content_length: bisected down to the document
                raise BatchRefusedError(
                    f"sink {self.name!r}: Elasticsearch refused a bulk request of {len(chunk)} action(s) as too "
                    f"large (413)", about_data=True) from exc
            if exc.meta.status in (401, 403):
                raise SinkBlockedError(f"Elasticsearch refused the bulk request ({exc.meta.status}): "
                                       f"{redact(str(exc))} (sink {self.name!r})") from exc
            raise FatalError(f"sink {self.name!r}: Elasticsearch refused a bulk request ({exc.meta.status}): "
                             f"{exc}") from exc
        except TransportError as exc:
            raise RetriableError(f"sink {self.name!r}: Elasticsearch unreachable: {exc}") from exc


    def _send(self, chunk: list[tuple[SinkRecord, bytes]]) -> list[RecordFailure]:
        """One bulk request, then its items answered 429 again (``item_retries``, backoff 0.5 s doubling to 10 s).

        The per-item results are read only when the answer says ``errors`` (the
        common case reads nothing per item): 2xx, 409 (a newer version is there)
        and 404 on delete are applied; 429 (and 413) items are sent again; 5xx items
        make the batch retriable; an error any document would get blocks the sink;
        any other refusal is about the record's data.

        Returns:
            The refused records: about their data, or (:class:`ElasticsearchThrottledError`)
            still answered 429/413 after the retries, which :meth:`write` judges.

        Raises:
            SinkBlockedError: an item error any document would get.
            RetriableError: 5xx items.
        """
        failures: list[RecordFailure] = []
        pending = chunk
        last: dict[int, str] = {}  # id(record) -> the answer of its last refusal (429/413)
        for attempt in range(self.config.item_retries + 1):
            if attempt:
                time.sleep(min(10.0, 0.5 * 2 ** (attempt - 1)))
            answer = self._bulk(pending)
            if not answer.get("errors"):
                return failures
            throttled = self._judge_items(pending, answer["items"], failures, last)
            if not throttled:
                return failures
            pending = throttled
        # judged by write() over the whole batch: throughput (backpressure) or these documents' own limit
        for record, _lines in pending:
            exc = ElasticsearchThrottledError(
                f"{record.where()}: index {self.config.index!r} refused the document on "
                f"{self.config.item_retries + 1} attempt(s) ({last[id(record)]}) while other documents of the "
                "batch were indexed")
            failures.append(RecordFailure(record, exc))
        return failures

    def _judge_items(self, pending: list[tuple[SinkRecord, bytes]], items: list[Any], failures: list[RecordFailure],
                     last: dict[int, str]) -> list[tuple[SinkRecord, bytes]]:
        """Judge the items of a bulk answer with ``errors`` (see :meth:`_send`); refusals about data join ``failures``.

        Args:
            pending: the request's ``(record, NDJSON lines)``, in the order of ``items``.
            items: the answer's items.
            failures: where the records refused for their data go.
            last: ``id(record)`` -> the answer of its last 429/413, updated.

        Returns:
            The items answered 429 or 413, to send again.

        Raises:
            SinkBlockedError: an item error any document would get.
            RetriableError: 5xx items.
        """
        throttled: list[tuple[SinkRecord, bytes]] = []
        retry_items = 0
        for (record, lines), item in zip(pending, items, strict=True):
            op, info = next(iter(item.items()))
            status = int(info.get("status", 0))
            if status < 300 or status == 409 or (status == 404 and op == "delete"):
                continue  # applied / a newer version is already there / nothing to delete
            error = info.get("error") or {}
            reason = error.get("reason") if isinstance(error, dict) else str(error)
            etype = error.get("type") if isinstance(error, dict) else "error"
            if etype in TARGET_ITEM_ERRORS or status in (401, 403):
                # before 429: the flood-stage block answers 429 too, and waits for disk space, not for load
                raise SinkBlockedError(f"index {self.config.index!r} refuses writes ({status} {etype}): {reason} "
                                       f"(sink {self.name!r})")
            if status in (429, 413):
                throttled.append((record, lines))
                last[id(record)] = f"{status} {etype}: {reason}"
            elif status >= 500:
                retry_items += 1
            else:
                exc = ElasticsearchItemError(f"{record.where()}: index {self.config.index!r} refused _id "
                                             f"{info.get('_id')!r} ({status} {etype}): {reason}")
                failures.append(RecordFailure(record, exc, about_data=True))
        if retry_items:
            raise RetriableError(f"sink {self.name!r}: {retry_items} item(s) failed with 5xx")
        return throttled
