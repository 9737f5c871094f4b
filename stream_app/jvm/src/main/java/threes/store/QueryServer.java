package threes.store;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.time.Instant;
import java.time.LocalDateTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeParseException;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.function.Supplier;
import java.util.logging.Level;
import java.util.logging.Logger;
import org.apache.avro.Schema;

/**
 * Interactive queries of the state stores of this JVM, over HTTP (JSON), with no Python and no Spark job.
 *
 * <ul>
 *   <li>{@code GET /snapshots}: the snapshots served.
 *   <li>{@code GET /snapshots/{name}}: keys, offsets, engine, retention, readiness.
 *   <li>{@code GET /snapshots/{name}/{key}[?as_of=]} (a one-field or string key), or {@code GET
 *       /snapshots/{name}?field=...&field=...[&as_of=]} (a composite key): the latest value, or the
 *       version valid at {@code as_of} (epoch ms or ISO-8601) with {@code valid_from_ms}/{@code valid_to_ms}.
 *   <li>{@code GET /snapshots/{name}?from=&to=&limit=}: a bounded range scan of the latest values,
 *       {@code from} inclusive, {@code to} exclusive, in the store's key order (as Kafka Streams' {@code
 *       range}, the serialized keys' bytes: a {@code key_format: string} key in UTF-8 order, an Avro string
 *       key by its length, then its UTF-8 bytes); {@code limit} defaults to 100, at most 10,000.
 *   <li>{@code GET /healthz}: 200 while the server runs; {@code GET /readyz}: 200 once every store is ready.
 * </ul>
 *
 * <p>Errors are {@code {"error": ...}} with 400 (malformed key or time), 401 (token), 404 (unknown
 * snapshot, absent key), 414 (a request line over 64 KiB) and 503 with {@code Retry-After} while a store
 * loads (never a partial answer) or after it failed. With a token, every path but {@code /healthz} and
 * {@code /readyz} needs {@code Authorization: Bearer <token>}. No traceback and no setting is ever sent.
 */
public final class QueryServer implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(QueryServer.class.getName());
  static final int MAX_REQUEST_BYTES = 64 * 1024;
  static final int MAX_RANGE = 10_000;

  private final HttpServer server;
  private final ExecutorService pool;
  private final Supplier<Map<String, SnapshotStore>> stores;
  private final byte[] token;

  /**
   * Start serving.
   *
   * @param host the address to bind (127.0.0.1 unless told)
   * @param port the port; 0 picks a free one ({@link #port()})
   * @param token the bearer token; null or empty: none (loopback only is the caller's rule)
   * @param threads request threads
   * @param stores the stores to serve, by snapshot name (asked per request: stores may come later)
   * @throws IOException the port cannot be bound
   */
  public QueryServer(String host, int port, String token, int threads, Supplier<Map<String, SnapshotStore>> stores)
      throws IOException {
    // the JDK server drops a connection whose request head passes this limit, without an answer: raise it so
    // that a request over MAX_REQUEST_BYTES (a 1 MB key) gets its JSON 414 (read once, at the first server)
    if (System.getProperty("sun.net.httpserver.maxReqHeaderSize") == null) {
      System.setProperty("sun.net.httpserver.maxReqHeaderSize", String.valueOf(4 << 20));
    }
    // the head and the body of an answer are two writes: without TCP_NODELAY, Nagle's algorithm holds the
    // body until the client's delayed ACK (40 ms) on a keep-alive connection
    if (System.getProperty("sun.net.httpserver.nodelay") == null) {
      System.setProperty("sun.net.httpserver.nodelay", "true");
    }
    this.stores = stores;
    this.token = token == null || token.isEmpty() ? null : token.getBytes(StandardCharsets.UTF_8);
    this.server = HttpServer.create(new InetSocketAddress(host, port), 1024);
    this.pool = Executors.newFixedThreadPool(threads, r -> {
      Thread t = new Thread(r, "threes-query");
      t.setDaemon(true);
      return t;
    });
    server.setExecutor(pool);
    server.createContext("/", this::handle);
    server.start();
  }

  /**
   * Serve the stores of this JVM whose spec ids are {@code storeIds}, by snapshot name (the job's driver).
   *
   * @see #QueryServer
   */
  public static QueryServer forStores(String host, int port, String token, int threads, List<String> storeIds)
      throws IOException {
    java.util.Set<String> ids = java.util.Set.copyOf(storeIds);
    return new QueryServer(host, port, token, threads, () -> {
      Map<String, SnapshotStore> out = new TreeMap<>();
      SnapshotStore.stores().forEach((id, store) -> {
        if (ids.contains(id)) {
          out.put(store.spec().name(), store);
        }
      });
      return out;
    });
  }

  /** The bound port. */
  public int port() {
    return server.getAddress().getPort();
  }

  @Override
  public void close() {
    server.stop(0);
    pool.shutdownNow();
  }

  private void handle(HttpExchange exchange) throws IOException {
    int status;
    String body;
    Map<String, String> headers = new TreeMap<>();
    try {
      Answer answer = answer(exchange);
      status = answer.status;
      body = answer.body;
      if (status == 503) {
        headers.put("Retry-After", "1");
      }
    } catch (RuntimeException | IOException e) { // never a traceback to the client
      LOG.log(Level.WARNING, "query " + exchange.getRequestURI().getRawPath() + " failed", e);
      status = 500;
      body = error("the query failed: " + e.getClass().getSimpleName());
    }
    byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
    exchange.getResponseHeaders().set("Content-Type", "application/json");
    headers.forEach((k, v) -> exchange.getResponseHeaders().set(k, v));
    exchange.sendResponseHeaders(status, bytes.length);
    try (OutputStream out = exchange.getResponseBody()) {
      out.write(bytes);
    }
  }

  record Answer(int status, String body) {}

  private Answer answer(HttpExchange exchange) throws IOException {
    String rawPath = exchange.getRequestURI().getRawPath();
    String rawQuery = exchange.getRequestURI().getRawQuery();
    if (rawPath.length() + (rawQuery == null ? 0 : rawQuery.length()) > MAX_REQUEST_BYTES) {
      return new Answer(414, error("the request is longer than " + MAX_REQUEST_BYTES + " bytes"));
    }
    if (!"GET".equals(exchange.getRequestMethod())) {
      return new Answer(405, error("only GET"));
    }
    if (rawPath.equals("/healthz")) {
      return new Answer(200, "{\"status\":\"ok\"}");
    }
    Map<String, SnapshotStore> served = stores.get();
    if (rawPath.equals("/readyz")) {
      boolean ready = served.values().stream().allMatch(SnapshotStore::isReady);
      return new Answer(ready ? 200 : 503, ready ? "{\"status\":\"ready\"}" : error("loading"));
    }
    if (token != null && !authorized(exchange.getRequestHeaders().getFirst("Authorization"))) {
      return new Answer(401, error("a bearer token is required (Authorization: Bearer ...)"));
    }
    String[] parts = rawPath.replaceAll("^/+|/+$", "").split("/", -1);
    if (parts.length == 1 && parts[0].equals("snapshots")) {
      StringBuilder out = new StringBuilder("{\"snapshots\":[");
      String sep = "";
      for (String name : new TreeMap<>(served).keySet()) {
        out.append(sep);
        JsonValues.string(out, name);
        sep = ",";
      }
      return new Answer(200, out.append("]}").toString());
    }
    if (parts.length < 2 || parts.length > 3 || !parts[0].equals("snapshots")) {
      return new Answer(404, error("try /snapshots, /snapshots/{name}, /snapshots/{name}/{key} or "
          + "/snapshots/{name}?from=&to=&limit="));
    }
    String name = decode(parts[1]);
    SnapshotStore store = served.get(name);
    if (store == null) {
      return new Answer(404, error("no snapshot '" + name + "' (have: " + new TreeMap<>(served).keySet() + ")"));
    }
    if (store.failureMessage() != null) {
      return new Answer(503, error("snapshot " + name + " failed: " + store.failureMessage()));
    }
    if (!store.isReady()) {
      return new Answer(503, error("snapshot " + name + " is loading (" + store.applied() + " records so far)"));
    }
    Map<String, String> query = query(rawQuery);
    try {
      return SnapshotAnswers.answer(store, parts.length == 3 ? decode(parts[2]) : null, query);
    } catch (IllegalArgumentException e) {
      return new Answer(400, error(e.getMessage()));
    } catch (SnapshotAnswers.Absent e) {
      return new Answer(404, e.getMessage());
    }
  }

  static Answer ok(String body) {
    return new Answer(200, body);
  }

  private boolean authorized(String header) {
    if (header == null || !header.startsWith("Bearer ")) {
      return false;
    }
    return MessageDigest.isEqual(token, header.substring(7).trim().getBytes(StandardCharsets.UTF_8));
  }

  private static Map<String, String> query(String raw) {
    Map<String, String> out = new LinkedHashMap<>();
    if (raw == null || raw.isEmpty()) {
      return out;
    }
    for (String pair : raw.split("&")) {
      int eq = pair.indexOf('=');
      String k = decode(eq < 0 ? pair : pair.substring(0, eq));
      out.put(k, eq < 0 ? "" : decode(pair.substring(eq + 1)));
    }
    return out;
  }

  private static String decode(String s) {
    try {
      return URLDecoder.decode(s.replace("+", "%2B"), StandardCharsets.UTF_8);
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("malformed percent-encoding in '" + s + "'");
    }
  }

  static String error(String message) {
    StringBuilder out = new StringBuilder("{\"error\":");
    JsonValues.string(out, message);
    return out.append('}').toString();
  }

  /**
   * A time given as epoch milliseconds or ISO-8601 (no zone: UTC), in epoch ms.
   *
   * @throws IllegalArgumentException neither
   */
  static long parseTimeMs(String text) {
    String t = text.trim();
    if (t.matches("-?\\d{1,19}")) {
      return Long.parseLong(t);
    }
    try {
      return OffsetDateTime.parse(t).toInstant().toEpochMilli();
    } catch (DateTimeParseException e) {
      try {
        return LocalDateTime.parse(t).toInstant(ZoneOffset.UTC).toEpochMilli();
      } catch (DateTimeParseException e2) {
        try {
          return Instant.parse(t).toEpochMilli();
        } catch (DateTimeParseException e3) {
          throw new IllegalArgumentException("as_of '" + text + "' is neither epoch milliseconds nor ISO-8601");
        }
      }
    }
  }

  static Schema schema(String json) {
    return json == null ? null : new Schema.Parser().parse(json);
  }

  static List<String> names(Schema keySchema) {
    return keySchema == null ? List.of() : keySchema.getFields().stream().map(Schema.Field::name).toList();
  }
}
