package threes.store;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Logger;

/**
 * The state store of one snapshot in this JVM: a GlobalKTable kept fresh by a daemon consumer, persisted
 * in RocksDB, versioned with {@code retention}, queryable.
 *
 * <p>What Kafka Streams' global stream thread does for a GlobalKTable (KIP-99): the consumer ({@link
 * StoreLoader}) is assigned every partition of the snapshot's compacted topics (no consumer group),
 * reads from the offsets the persisted store covers (or the beginning), and applies each record: an
 * upsert, or a delete for a tombstone; with {@code retention}, also a version of the key (KIP-889).
 *
 * <p><b>Two tiers, one store.</b> Every record goes to the {@link RocksState} in the state folder, whose
 * checkpoints carry the offsets they cover, so a restarted JVM reads only the topics' tail and a snapshot
 * larger than the heap works. The latest values are also kept in an in-heap table ({@link SnapshotTable})
 * while they fit {@code max_bytes}: a lookup of the latest value is then a hash-map read (a few hundred
 * nanoseconds, against microseconds for RocksDB). A snapshot that outgrows it drops the table and is
 * served from RocksDB alone, with a log line; {@code max_bytes: 0} never keeps one. A load writes RocksDB
 * alone (one copy per record, as Kafka Streams' restore); the in-heap table is built from it once the
 * store is ready.
 *
 * <p><b>Readiness gate.</b> {@link #awaitReady} returns once the consumer reached the end offsets the
 * topics had when it started. After that the store is <i>eventually fresh</i>: an update is visible once
 * this thread applied it (milliseconds), with no ordering against the events.
 *
 * <p>One store per snapshot spec per JVM ({@link #forSpec}): every task and the query server read the same
 * one, and it outlives the queries. A topic deleted, or deleted and created again, while the store runs
 * fails it (its Kafka topic id, KIP-516); records that do not decode are counted and logged, never applied.
 */
public final class SnapshotStore implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(SnapshotStore.class.getName());
  private static final Map<String, SnapshotStore> STORES = new ConcurrentHashMap<>();

  final StoreSpec spec;
  final CountDownLatch ready = new CountDownLatch(1);
  final AtomicLong applied = new AtomicLong();
  final AtomicLong tombstones = new AtomicLong();
  final AtomicLong badRecords = new AtomicLong();
  final Map<String, Long> positions = new ConcurrentHashMap<>();
  volatile SnapshotTable heap;
  volatile RocksState state;
  volatile long lastAppliedTimestampMs = -1;
  volatile long streamTimeMs = Long.MIN_VALUE;
  volatile long restoredKeys = -1;
  volatile long readyMs = -1;
  volatile Throwable failure;
  volatile boolean closing;
  private final Thread thread;
  private final StoreLoader loader;

  private SnapshotStore(StoreSpec spec) {
    this.spec = spec;
    this.heap = spec.maxBytes() > 0 ? new SnapshotTable(spec.name(), spec.maxBytes()) : null;
    this.loader = new StoreLoader(this);
    this.thread = new Thread(loader, "threes-snapshot-" + spec.name());
    this.thread.setDaemon(true);
  }

  /** The store of {@code spec} in this JVM, started on first use. */
  public static SnapshotStore forSpec(StoreSpec spec) {
    return STORES.computeIfAbsent(
        spec.storeId(),
        id -> {
          SnapshotStore store = new SnapshotStore(spec);
          store.thread.start();
          return store;
        });
  }

  /** Stop and forget the store of {@code spec} in this JVM, if any (its state is checkpointed first). */
  public static void closeStore(StoreSpec spec) {
    SnapshotStore store = STORES.remove(spec.storeId());
    if (store != null) {
      store.close();
    }
  }

  /** Stop and forget every store of this JVM (a stopping job, tests). */
  public static void closeAll() {
    for (String id : new ArrayList<>(STORES.keySet())) {
      SnapshotStore store = STORES.remove(id);
      if (store != null) {
        store.close();
      }
    }
  }

  /** The stores of this JVM, by snapshot spec id. */
  public static Map<String, SnapshotStore> stores() {
    return Map.copyOf(STORES);
  }

  /**
   * Wait for the first load (the readiness gate).
   *
   * @throws IllegalStateException the store failed (Kafka unreachable, a full disk, a topic deleted), or
   *     was not loaded within the spec's {@code readyTimeoutMs}
   */
  public void awaitReady() {
    if (ready.getCount() > 0) {
      try {
        if (!ready.await(spec.readyTimeoutMs(), TimeUnit.MILLISECONDS)) {
          throw new IllegalStateException(String.format("snapshot %s not loaded within %d ms (%d records so far)",
              spec.name(), spec.readyTimeoutMs(), applied.get()));
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IllegalStateException("interrupted waiting for snapshot " + spec.name(), e);
      }
    }
    Throwable failed = failure;
    if (failed != null) {
      throw new IllegalStateException(failed.getMessage(), failed);
    }
  }

  /** Whether the first load is done and the store has not failed. */
  public boolean isReady() {
    return ready.getCount() == 0 && failure == null;
  }

  /** Why the store failed, or null. */
  public String failureMessage() {
    Throwable failed = failure;
    return failed == null ? null : String.valueOf(failed.getMessage());
  }

  /** The latest value body of a key body, after the readiness gate; null when the snapshot has no such key. */
  public byte[] lookup(byte[] key) {
    awaitReady();
    SnapshotTable table = heap;
    return table != null ? table.get(key) : state.latest(key);
  }

  /**
   * The version of a key valid at a time, after the readiness gate.
   *
   * @param key the key body
   * @param atMs the time, epoch milliseconds
   * @return the version, or null when the key had no value then (absent, deleted, or older than the
   *     retention keeps)
   * @throws IllegalStateException the snapshot keeps no versions (no {@code retention})
   */
  public RocksState.Version lookupAsOf(byte[] key, long atMs) {
    awaitReady();
    if (!spec.versioned()) {
      throw new IllegalStateException("snapshot " + spec.name() + " keeps no versions (no retention): as_of does "
          + "not apply");
    }
    if (atMs < horizonMs()) { // older than the retention keeps: unknown, as the micro-batch engines answer
      return null;
    }
    return state.versionAt(key, atMs);
  }

  /** Up to {@code limit} latest entries with {@code from <= key < to}, in key order (see {@link RocksState#range}). */
  public List<byte[][]> range(byte[] from, byte[] to, int limit) {
    awaitReady();
    return state.range(from, to, limit);
  }

  /**
   * The earliest time an {@code as_of} query can be answered for, epoch ms: the newest source time applied
   * (the store's stream time) minus the retention; {@link Long#MIN_VALUE} when unbounded.
   */
  public long horizonMs() {
    long now = streamTimeMs;
    return spec.versioned() && now != Long.MIN_VALUE ? now - spec.retentionMs() : Long.MIN_VALUE;
  }

  /** The spec the store was built from. */
  public StoreSpec spec() {
    return spec;
  }

  /** Where the latest values are read from: {@code heap} (and RocksDB), or {@code rocksdb} alone. */
  public String engine() {
    return heap != null ? "heap" : "rocksdb";
  }

  /** Latest keys held: exact in the heap, RocksDB's estimate otherwise; -1 before the store opened. */
  public long keys() {
    SnapshotTable table = heap;
    RocksState s = state;
    return table != null ? table.size() : s == null ? -1 : s.estimatedKeys();
  }

  /** Heap counted for the in-heap table, in bytes (0 without one). */
  public long heapBytes() {
    SnapshotTable table = heap;
    return table == null ? 0 : table.bytes();
  }

  /** The bytes of the RocksDB folder on disk; -1 before the store opened. */
  public long diskBytes() {
    RocksState s = state;
    return s == null ? -1 : s.diskBytes();
  }

  /** Latest keys found in the state folder at start (restored, not read from Kafka); -1: started empty. */
  public long restoredKeys() {
    return restoredKeys;
  }

  /** Milliseconds from start to ready; -1 before. */
  public long readyMs() {
    return readyMs;
  }

  /** Records applied (upserts and tombstones). */
  public long applied() {
    return applied.get();
  }

  /** Tombstones applied. */
  public long tombstones() {
    return tombstones.get();
  }

  /** Records that could not be read. */
  public long badRecords() {
    return badRecords.get();
  }

  /** The Kafka timestamp of the last applied record, in ms since the epoch; -1 before the first. */
  public long lastAppliedTimestampMs() {
    return lastAppliedTimestampMs;
  }

  /** The next offset to read per {@code topic:partition}: where the store stands. */
  public Map<String, Long> positions() {
    return Map.copyOf(positions);
  }

  /** Stop the consumer thread; the store is checkpointed and closed. */
  @Override
  public void close() {
    closing = true;
    loader.wakeup();
    try {
      thread.join(30_000);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** The store's RocksDB folder: under {@code stateDir}, or a temporary one. */
  Path folder() throws IOException {
    String name = spec.name().replaceAll("[^A-Za-z0-9_.-]", "_") + "-" + spec.fingerprint().substring(0, 12);
    if (spec.stateDir() == null || spec.stateDir().isBlank()) {
      return Files.createTempDirectory("threes-state-" + name + "-");
    }
    return Path.of(spec.stateDir(), name);
  }

  /** Whether the folder is temporary (deleted at close). */
  boolean temporary() {
    return spec.stateDir() == null || spec.stateDir().isBlank();
  }

  static void log(String message) {
    LOG.info(message);
  }
}
