package threes.store;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.Map;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The query server's rules with a store that cannot load (no Kafka at its address): 503, token, limits. */
class QueryServerTest {
  static final String KEY = "{\"type\":\"record\",\"name\":\"k\",\"fields\":[{\"name\":\"faa\",\"type\":\"string\"}]}";
  static final String VALUE = "{\"type\":\"record\",\"name\":\"v\",\"fields\":[{\"name\":\"name\",\"type\":\"string\"}]}";
  static StoreSpec spec;
  static QueryServer server;
  static HttpClient client = HttpClient.newHttpClient();

  @BeforeAll
  static void start() throws Exception {
    spec = new StoreSpec("loading", "bootstrap.servers=127.0.0.1:1\n", "state.airports", "_schemas", KEY, VALUE,
        1 << 20, 600_000, "", null, -1);
    SnapshotStore store = SnapshotStore.forSpec(spec);
    server = new QueryServer("127.0.0.1", 0, "s3cret", 4, () -> Map.of("loading", store));
  }

  @AfterAll
  static void stop() {
    server.close();
    SnapshotStore.closeStore(spec);
  }

  static HttpResponse<String> get(String path, String token) throws Exception {
    HttpRequest.Builder request = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.port() + path));
    if (token != null) {
      request.header("Authorization", "Bearer " + token);
    }
    return client.send(request.build(), HttpResponse.BodyHandlers.ofString());
  }

  @Test
  void aQueryWhileTheStoreLoadsIs503WithRetryAfterNeverAPartialAnswer() throws Exception {
    HttpResponse<String> r = get("/snapshots/loading/EWR", "s3cret");
    assertEquals(503, r.statusCode());
    assertEquals("1", r.headers().firstValue("Retry-After").orElse(null));
    assertTrue(r.body().contains("is loading"), r.body());
    assertEquals(503, get("/readyz", null).statusCode());
    assertEquals(200, get("/healthz", null).statusCode()); // probes need no token
  }

  @Test
  void everyOtherPathNeedsTheToken() throws Exception {
    assertEquals(401, get("/snapshots/loading/EWR", null).statusCode());
    assertEquals(401, get("/snapshots/loading/EWR", "wrong").statusCode());
    assertEquals(401, get("/snapshots", "s3cret-but-longer").statusCode());
    assertTrue(get("/snapshots", null).body().startsWith("{\"error\":"));
  }

  @Test
  void unknownNamesLongRequestsAndOtherMethodsGetJsonErrors() throws Exception {
    HttpResponse<String> r = get("/snapshots/nope/EWR", "s3cret");
    assertEquals(404, r.statusCode());
    assertTrue(r.body().contains("no snapshot 'nope'"), r.body());
    assertEquals(404, get("/snapshots/..%2F..%2Fetc/passwd", "s3cret").statusCode());
    assertEquals(414, get("/snapshots/loading/" + "K".repeat(70_000), "s3cret").statusCode());
    HttpResponse<String> post = client.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.port()
        + "/snapshots")).POST(HttpRequest.BodyPublishers.noBody()).header("Authorization", "Bearer s3cret").build(),
        HttpResponse.BodyHandlers.ofString());
    assertEquals(405, post.statusCode());
  }

  @Test
  void timesAreEpochMillisecondsOrIso8601() {
    assertEquals(1357000000000L, QueryServer.parseTimeMs("1357000000000"));
    assertEquals(1356998400000L, QueryServer.parseTimeMs("2013-01-01T00:00:00Z"));
    assertEquals(1356998400000L, QueryServer.parseTimeMs("2013-01-01T00:00:00"));
    assertEquals(1356998400000L, QueryServer.parseTimeMs("2013-01-01T01:00:00+01:00"));
    org.junit.jupiter.api.Assertions.assertThrows(IllegalArgumentException.class,
        () -> QueryServer.parseTimeMs("yesterday"));
  }
}
