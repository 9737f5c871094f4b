package threes.store;

import java.io.IOException;
import java.io.Reader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.logging.Logger;

/**
 * {@code threes serve}: the state stores of a pipeline's snapshots in a process of their own, with the
 * query server and no Spark. A queryable replica: run more of them to serve more.
 *
 * <p>Arguments: {@code <spec file> <host> <port>}; the bearer token, if any, in the environment variable
 * {@code THREES_SERVE_TOKEN} (never on the command line, which other users can read). The spec file is a
 * {@link Properties} file written by the Python CLI: {@code snapshots} (names, comma-separated), then per
 * name the {@link StoreSpec} fields as {@code <name>.<field>}. It is deleted once read (it holds the
 * Kafka credentials). Prints {@code threes-serve listening <port>} once bound, {@code threes-serve ready}
 * once every store is loaded; stops on SIGTERM, checkpointing every store.
 */
public final class ServeMain {
  private static final Logger LOG = Logger.getLogger(ServeMain.class.getName());

  private ServeMain() {}

  /** The entry point; exit code 2 for unusable arguments. */
  public static void main(String[] args) throws Exception {
    if (args.length != 3) {
      System.err.println("usage: ServeMain <spec file> <host> <port>");
      System.exit(2);
    }
    Map<String, StoreSpec> specs = read(Path.of(args[0]));
    Map<String, SnapshotStore> stores = new LinkedHashMap<>();
    specs.forEach((name, spec) -> stores.put(name, SnapshotStore.forSpec(spec)));
    String token = System.getenv("THREES_SERVE_TOKEN");
    QueryServer server = new QueryServer(args[1], Integer.parseInt(args[2]), token, 16, () -> stores);
    CountDownLatch stop = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      server.close();
      SnapshotStore.closeAll();
      stop.countDown();
    }, "threes-serve-stop"));
    System.out.println("threes-serve listening " + server.port());
    System.out.flush();
    for (SnapshotStore store : stores.values()) {
      try {
        store.awaitReady();
      } catch (IllegalStateException e) {
        System.out.println("threes-serve failed " + store.spec().name() + ": " + e.getMessage());
        System.out.flush();
      }
    }
    System.out.println("threes-serve ready");
    System.out.flush();
    LOG.info("serving " + stores.keySet() + " on " + args[1] + ":" + server.port());
    stop.await();
  }

  static Map<String, StoreSpec> read(Path file) throws IOException {
    Properties p = new Properties();
    try (Reader reader = Files.newBufferedReader(file)) {
      p.load(reader);
    }
    Files.deleteIfExists(file);
    Map<String, StoreSpec> out = new LinkedHashMap<>();
    for (String name : p.getProperty("snapshots", "").split(",")) {
      if (name.isBlank()) {
        continue;
      }
      String k = name + ".";
      out.put(name, new StoreSpec(name, p.getProperty(k + "consumer_config", ""), p.getProperty(k + "topics"),
          p.getProperty(k + "schema_topic"), p.getProperty(k + "key_schema"), p.getProperty(k + "value_schema"),
          Long.parseLong(p.getProperty(k + "max_bytes", "0")),
          Long.parseLong(p.getProperty(k + "ready_timeout_ms", "600000")), p.getProperty(k + "start_offsets", ""),
          p.getProperty(k + "state_dir", ""), Long.parseLong(p.getProperty(k + "retention_ms", "-1"))));
    }
    return out;
  }
}
