package threes.store;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.avro.Schema;

/**
 * The JSON answers of {@link QueryServer} for one ready store: a description, a key's value (now or as
 * of a time), a range scan.
 */
final class SnapshotAnswers {
  private static final Map<String, Schema[]> SCHEMAS = new ConcurrentHashMap<>();

  private SnapshotAnswers() {}

  /** A key the store does not hold (then, or now): HTTP 404, its message the JSON document. */
  static final class Absent extends Exception {
    private static final long serialVersionUID = 1L;

    Absent(String json) {
      super(json, null, false, false);
    }
  }

  private static Schema[] schemas(StoreSpec spec) {
    return SCHEMAS.computeIfAbsent(spec.storeId(),
        id -> new Schema[] {QueryServer.schema(spec.keySchema()), QueryServer.schema(spec.valueSchema())});
  }

  /**
   * Answer a query of {@code store}.
   *
   * @param keySegment the key from the path ({@code /snapshots/{name}/{key}}), or null
   * @param query the query parameters: key fields, {@code as_of}, or {@code from}/{@code to}/{@code limit}
   * @throws IllegalArgumentException a malformed key, time or limit (400)
   * @throws Absent no value for the key (404)
   */
  static QueryServer.Answer answer(SnapshotStore store, String keySegment, Map<String, String> query) throws IOException,
      Absent {
    Schema[] schemas = schemas(store.spec());
    Map<String, String> fields = new LinkedHashMap<>(query);
    String asOf = fields.remove("as_of");
    if (keySegment == null && (fields.containsKey("from") || fields.containsKey("to") || fields.containsKey("limit"))
        && !QueryServer.names(schemas[0]).contains("from")) {
      return range(store, schemas, fields);
    }
    if (keySegment == null && fields.isEmpty()) {
      return describe(store);
    }
    List<String> names = QueryServer.names(schemas[0]);
    if (keySegment != null) {
      if (names.size() > 1) {
        throw new IllegalArgumentException("snapshot '" + store.spec().name() + "' has a composite key " + names
            + ": give its fields as query parameters, /snapshots/" + store.spec().name() + "?"
            + String.join("=...&", names) + "=...");
      }
      fields = Map.of(names.isEmpty() ? "key" : names.get(0), keySegment);
    }
    byte[] key = JsonValues.keyBody(schemas[0], fields);
    String keyText = fields.size() == 1 ? fields.values().iterator().next() : new TreeMap<>(fields).toString();
    StringBuilder head = new StringBuilder("{\"snapshot\":");
    JsonValues.string(head, store.spec().name());
    head.append(",\"key\":");
    JsonValues.string(head, keyText);
    head.append(",\"offsets\":");
    offsets(head, store.positions());
    if (asOf != null) {
      long at = QueryServer.parseTimeMs(asOf);
      if (!store.spec().versioned()) {
        throw new IllegalArgumentException("snapshot '" + store.spec().name()
            + "' keeps no versions (no retention): as_of does not apply");
      }
      head.append(",\"as_of_ms\":").append(at);
      if (at < store.horizonMs()) {
        throw new Absent(head + ",\"error\":\"" + at + " is older than the retention (horizon " + store.horizonMs()
            + " ms)\"}");
      }
      RocksState.Version version = store.lookupAsOf(key, at);
      if (version == null) {
        throw new Absent(head + ",\"error\":\"no version of this key at that time\"}");
      }
      head.append(",\"valid_from_ms\":").append(version.validFromMs()).append(",\"valid_to_ms\":")
          .append(version.validToMs() == Long.MAX_VALUE ? "null" : Long.toString(version.validToMs()))
          .append(",\"value\":");
      JsonValues.body(head, schemas[1], version.value());
      return QueryServer.ok(head.append('}').toString());
    }
    byte[] value = store.lookup(key);
    if (value == null) {
      throw new Absent(head + ",\"error\":\"absent\"}");
    }
    head.append(",\"value\":");
    JsonValues.body(head, schemas[1], value);
    return QueryServer.ok(head.append('}').toString());
  }

  private static QueryServer.Answer describe(SnapshotStore store) {
    StringBuilder out = new StringBuilder("{\"snapshot\":");
    JsonValues.string(out, store.spec().name());
    out.append(",\"keys\":").append(store.keys()).append(",\"offsets\":");
    offsets(out, store.positions());
    out.append(",\"engine\":");
    JsonValues.string(out, store.engine());
    out.append(",\"retention_ms\":").append(store.spec().versioned() ? store.spec().retentionMs() : "null")
        .append(",\"disk_bytes\":").append(store.diskBytes()).append(",\"heap_bytes\":").append(store.heapBytes())
        .append(",\"restored_keys\":").append(store.restoredKeys()).append(",\"ready_ms\":").append(store.readyMs())
        .append('}');
    return QueryServer.ok(out.toString());
  }

  private static QueryServer.Answer range(SnapshotStore store, Schema[] schemas, Map<String, String> q) throws IOException {
    int limit;
    try {
      limit = Integer.parseInt(q.getOrDefault("limit", "100"));
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException("limit must be an integer, got '" + q.get("limit") + "'");
    }
    if (limit < 1 || limit > QueryServer.MAX_RANGE) {
      throw new IllegalArgumentException("limit is between 1 and " + QueryServer.MAX_RANGE);
    }
    byte[] from = bound(schemas[0], q.get("from"));
    byte[] to = bound(schemas[0], q.get("to"));
    List<byte[][]> entries = store.range(from, to, limit);
    StringBuilder out = new StringBuilder("{\"snapshot\":");
    JsonValues.string(out, store.spec().name());
    out.append(",\"offsets\":");
    offsets(out, store.positions());
    out.append(",\"entries\":[");
    String sep = "";
    for (byte[][] e : entries) {
      out.append(sep).append("{\"key\":");
      if (schemas[0] == null) {
        JsonValues.string(out, new String(e[0], StandardCharsets.UTF_8));
      } else {
        JsonValues.body(out, schemas[0], e[0]);
      }
      out.append(",\"value\":");
      JsonValues.body(out, schemas[1], e[1]);
      out.append('}');
      sep = ",";
    }
    return QueryServer.ok(out.append("],\"limit\":").append(limit).append('}').toString());
  }

  /** A range bound: the key body of a one-field key given as text; null when not given. */
  private static byte[] bound(Schema keySchema, String text) throws IOException {
    if (text == null || text.isEmpty()) {
      return null;
    }
    List<String> names = QueryServer.names(keySchema);
    if (names.size() > 1) {
      throw new IllegalArgumentException("a range scan takes from/to of a one-field key; this key has " + names);
    }
    Map<String, String> parts = new HashMap<>();
    parts.put(names.isEmpty() ? "key" : names.get(0), text);
    return JsonValues.keyBody(keySchema, parts);
  }

  private static void offsets(StringBuilder out, Map<String, Long> positions) {
    Map<String, Map<Integer, Long>> byTopic = new TreeMap<>();
    positions.forEach((tp, offset) -> {
      int colon = tp.lastIndexOf(':');
      byTopic.computeIfAbsent(tp.substring(0, colon), t -> new TreeMap<>())
          .put(Integer.parseInt(tp.substring(colon + 1)), offset);
    });
    out.append('{');
    String sep = "";
    for (Map.Entry<String, Map<Integer, Long>> t : byTopic.entrySet()) {
      out.append(sep);
      JsonValues.string(out, t.getKey());
      out.append(":{");
      String inner = "";
      for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
        out.append(inner).append('"').append(p.getKey()).append("\":").append(p.getValue());
        inner = ",";
      }
      out.append('}');
      sep = ",";
    }
    out.append('}');
  }
}
