package threes.lookup;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Level;
import java.util.logging.Logger;
import org.apache.avro.Schema;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * A GlobalKTable-like store of one snapshot in this JVM, kept fresh by a daemon consumer.
 *
 * <p>What Kafka Streams' global stream thread does for a GlobalKTable (KIP-99): the consumer is
 * assigned every partition of the snapshot's compacted topics (no consumer group, no committed
 * offsets), reads from the given start offsets or the beginning, and applies each record to the
 * {@link SnapshotTable}: an upsert, or a delete for a tombstone. <b>Readiness gate:</b> {@link
 * #awaitReady} returns once the consumer has reached the end offsets the topics had when it started,
 * so the first event is enriched against a snapshot at least as fresh as the job's start. After
 * that the snapshot is <i>eventually fresh</i>: an update is visible once this thread applied it
 * (tens of milliseconds), with no ordering against the events.
 *
 * <p>One store per snapshot spec per JVM ({@link #forSpec}): every task of every query in the JVM
 * reads the same one, and it outlives the queries (a restarted query finds it loaded).
 *
 * <p>Records the store cannot read (no marker, unknown fingerprint, a body that does not decode) are
 * counted and logged, never applied; a snapshot that outgrows its {@code maxBytes} fails the store,
 * and every lookup after that throws with the numbers.
 *
 * <p>The store checks every {@link #TOPIC_CHECK_INTERVAL_MS} that its topics are still the ones it
 * loaded (their Kafka topic ids, KIP-516). A topic deleted, or deleted and created again, while the
 * store runs fails it: every lookup after that throws, saying which topic and what to do, rather than
 * answer from records of a topic that no longer exists (a Kafka consumer would wait for the deleted
 * topic without end, or read the new one on top of the old table).
 */
public final class SnapshotStore implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(SnapshotStore.class.getName());
  private static final Map<String, SnapshotStore> STORES = new ConcurrentHashMap<>();

  /** How often a store with a state folder writes its {@link StoreFile}, in milliseconds (and at close). */
  static final long WRITE_INTERVAL_MS = 60_000;

  /** How often the store checks that its topics were not deleted or created again, in milliseconds. */
  static final long TOPIC_CHECK_INTERVAL_MS = 10_000;

  private final StoreSpec spec;
  private final SnapshotTable table;
  private final CountDownLatch ready = new CountDownLatch(1);
  private final Thread thread;
  private final AtomicLong applied = new AtomicLong();
  private final AtomicLong tombstones = new AtomicLong();
  private final AtomicLong badRecords = new AtomicLong();
  private final Map<String, Long> positions = new ConcurrentHashMap<>();
  private volatile long lastAppliedTimestampMs = -1;
  private volatile long loadedFromFile = -1;
  private volatile Throwable failure;
  private volatile boolean closing;
  private volatile KafkaConsumer<byte[], byte[]> consumer;

  private SnapshotStore(StoreSpec spec) {
    this.spec = spec;
    this.table = new SnapshotTable(spec.name(), spec.maxBytes());
    this.thread = new Thread(this::run, "threes-snapshot-" + spec.name());
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

  /** Stop and forget the store of {@code spec} in this JVM, if any (its state file is written first). */
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
   * @throws IllegalStateException the store failed (too large, Kafka unreachable), or was not loaded
   *     within the spec's {@code readyTimeoutMs}
   */
  public void awaitReady() {
    if (ready.getCount() > 0) {
      try {
        if (!ready.await(spec.readyTimeoutMs(), TimeUnit.MILLISECONDS)) {
          throw new IllegalStateException(
              String.format("snapshot %s not loaded within %d ms (%d keys so far)", spec.name(),
                  spec.readyTimeoutMs(), table.size()));
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

  /** Whether the first load is done. */
  public boolean isReady() {
    return ready.getCount() == 0 && failure == null;
  }

  /** The value body of a key body, after the readiness gate; null when the snapshot has no such key. */
  public byte[] lookup(byte[] key) {
    awaitReady();
    return table.get(key);
  }

  /** The table (sizes, bytes). */
  public SnapshotTable table() {
    return table;
  }

  /** Keys loaded from the state file at start; -1 when the store started without one. */
  public long loadedFromFile() {
    return loadedFromFile;
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

  /** The next offset to read per {@code topic:partition}: where a checkpoint of this table stands. */
  public Map<String, Long> positions() {
    return Map.copyOf(positions);
  }

  /** Stop the consumer thread. */
  @Override
  public void close() {
    closing = true;
    KafkaConsumer<byte[], byte[]> c = consumer;
    if (c != null) {
      c.wakeup();
    }
    try {
      thread.join(10_000);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private void run() {
    Properties props = spec.consumerProperties();
    props.put("key.deserializer", ByteArrayDeserializer.class.getName());
    props.put("value.deserializer", ByteArrayDeserializer.class.getName());
    props.put("enable.auto.commit", "false");
    props.put("allow.auto.create.topics", "false"); // a deleted topic stays deleted: never created again, uncompacted
    props.putIfAbsent("auto.offset.reset", "earliest");
    props.remove("group.id");
    Duration timeout = Duration.ofMillis(Math.max(10_000, spec.readyTimeoutMs()));
    SchemaTopic schemas = new SchemaTopic(spec.schemaTopic(), spec.consumerProperties(), timeout);
    try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props);
        Admin admin = Admin.create(adminProperties(props))) {
      consumer = c;
      if (closing) {
        return;
      }
      SingleObjectCodec keys =
          spec.keySchema() == null ? null : new SingleObjectCodec(parse(spec.keySchema()), schemas::get);
      SingleObjectCodec values = new SingleObjectCodec(parse(spec.valueSchema()), schemas::get);
      List<TopicPartition> partitions = new ArrayList<>();
      for (String topic : spec.topicList()) {
        List<PartitionInfo> infos = c.partitionsFor(topic, timeout);
        if (infos == null || infos.isEmpty()) {
          throw new IllegalStateException("snapshot " + spec.name() + ": topic " + topic + " does not exist");
        }
        for (PartitionInfo info : infos) {
          partitions.add(new TopicPartition(topic, info.partition()));
        }
      }
      Map<String, String> topicIds = topicIds(admin, timeout);
      c.assign(partitions);
      Map<String, Long> start = spec.startOffsetMap();
      Path file = spec.stateDir() == null || spec.stateDir().isBlank() ? null : StoreFile.path(spec.stateDir(), spec);
      if (file != null && Files.exists(file)) {
        try {
          start = StoreFile.read(file, table, topicIds);
          loadedFromFile = table.size();
          LOG.info(String.format("snapshot %s: %d keys loaded from %s, reading the tail from %s", spec.name(),
              table.size(), file, start));
        } catch (StoreFile.StaleFileException e) {
          table.clear();
          LOG.info("snapshot " + spec.name() + ": reading the topics from their beginning: " + e.getMessage());
        } catch (IOException e) {
          table.clear();
          LOG.log(Level.WARNING, "snapshot " + spec.name() + ": unreadable " + file + ", reading the topics", e);
        }
      }
      List<TopicPartition> fromBeginning = new ArrayList<>();
      for (TopicPartition tp : partitions) {
        Long offset = start.get(tp.topic() + ":" + tp.partition());
        if (offset == null) {
          fromBeginning.add(tp);
        } else {
          c.seek(tp, offset);
        }
      }
      if (!fromBeginning.isEmpty()) { // an empty collection would mean every assigned partition
        c.seekToBeginning(fromBeginning);
      }
      Map<TopicPartition, Long> end = new HashMap<>(c.endOffsets(partitions, timeout));
      long began = System.nanoTime();
      long written = System.currentTimeMillis();
      long nextCheck = written + TOPIC_CHECK_INTERVAL_MS;
      Map<String, KafkaFuture<TopicDescription>> check = null;
      try {
        while (!closing) {
          if (check == null && System.currentTimeMillis() >= nextCheck) {
            check = admin.describeTopics(spec.topicList()).topicNameValues(); // answered while polling
          } else if (check != null && check.values().stream().allMatch(KafkaFuture::isDone)) {
            verifyTopics(check, topicIds);
            check = null;
            nextCheck = System.currentTimeMillis() + TOPIC_CHECK_INTERVAL_MS;
          }
          if (ready.getCount() > 0 && SchemaTopic.reached(c, end)) {
            LOG.info(String.format("snapshot %s ready: %d keys, %d bytes, %d records in %d ms", spec.name(),
                table.size(), table.bytes(), applied.get(), (System.nanoTime() - began) / 1_000_000));
            ready.countDown();
          }
          ConsumerRecords<byte[], byte[]> batch = c.poll(Duration.ofMillis(ready.getCount() > 0 ? 100 : 50));
          for (ConsumerRecord<byte[], byte[]> record : batch) {
            apply(record, keys, values);
          }
          for (TopicPartition tp : batch.partitions()) {
            positions.put(tp.topic() + ":" + tp.partition(), c.position(tp));
          }
          if (file != null && ready.getCount() == 0 && System.currentTimeMillis() - written >= WRITE_INTERVAL_MS) {
            try {
              save(c, partitions, topicIds, file);
            } catch (IOException e) { // the lookups go on; a restart reads more of the topics
              LOG.log(Level.WARNING, "snapshot " + spec.name() + ": cannot write " + file, e);
            }
            written = System.currentTimeMillis();
          }
        }
      } catch (WakeupException e) {
        // close(): the consumer was woken to stop
      }
      if (file != null && ready.getCount() == 0) {
        save(c, partitions, topicIds, file); // a restart then reads only what came after
      }
    } catch (Throwable e) {
      failure = e;
      LOG.log(Level.SEVERE, "snapshot " + spec.name() + " failed", e);
    } finally {
      consumer = null;
      ready.countDown();
    }
  }

  /** The admin client settings among the consumer's (connection and security). */
  private static Properties adminProperties(Properties consumer) {
    Properties admin = new Properties();
    for (String name : consumer.stringPropertyNames()) {
      if (AdminClientConfig.configNames().contains(name)) {
        admin.setProperty(name, consumer.getProperty(name));
      }
    }
    return admin;
  }

  /** The ids of the store's topics now, topic to id. */
  private Map<String, String> topicIds(Admin admin, Duration timeout) throws Exception {
    Map<String, String> ids = new HashMap<>();
    try {
      Map<String, TopicDescription> described =
          admin.describeTopics(spec.topicList()).allTopicNames().get(timeout.toMillis(), TimeUnit.MILLISECONDS);
      described.forEach((topic, d) -> ids.put(topic, d.topicId().toString()));
    } catch (ExecutionException e) {
      throw e.getCause() instanceof Exception cause ? cause : e;
    }
    return ids;
  }

  /**
   * Fail the store when a topic was deleted, or deleted and created again, since it was loaded.
   *
   * @throws IllegalStateException which topic, and what to do
   */
  private void verifyTopics(Map<String, KafkaFuture<TopicDescription>> check, Map<String, String> topicIds)
      throws InterruptedException {
    for (Map.Entry<String, KafkaFuture<TopicDescription>> e : check.entrySet()) {
      String topic = e.getKey();
      String id;
      try {
        id = e.getValue().get().topicId().toString();
      } catch (ExecutionException failed) {
        if (failed.getCause() instanceof UnknownTopicOrPartitionException) {
          throw new IllegalStateException(String.format(
              "snapshot %s: topic %s was deleted while the job ran; its lookups stop rather than answer from the "
                  + "records read before. Restart the job once the topic exists again",
              spec.name(), topic));
        }
        // Kafka away or slow: the consumer waits it out, and the next check asks again
        LOG.fine("snapshot " + spec.name() + ": cannot check topic " + topic + ": " + failed.getCause());
        continue;
      }
      if (!id.equals(topicIds.get(topic))) {
        throw new IllegalStateException(String.format(
            "snapshot %s: topic %s was deleted and created again while the job ran (topic id %s, now %s); its "
                + "lookups stop rather than mix the two topics' records. Restart the job: it loads the new topic "
                + "from its beginning",
            spec.name(), topic, topicIds.get(topic), id));
      }
    }
  }

  private void save(KafkaConsumer<byte[], byte[]> c, List<TopicPartition> partitions, Map<String, String> topicIds,
      Path file) throws IOException {
    Map<String, Long> offsets = new HashMap<>();
    for (TopicPartition tp : partitions) {
      offsets.put(tp.topic() + ":" + tp.partition(), c.position(tp));
    }
    long t0 = System.nanoTime();
    StoreFile.write(file, table, topicIds, offsets);
    LOG.info(String.format("snapshot %s: %d keys written to %s in %d ms", spec.name(), table.size(), file,
        (System.nanoTime() - t0) / 1_000_000));
  }

  private void apply(ConsumerRecord<byte[], byte[]> record, SingleObjectCodec keys, SingleObjectCodec values)
      throws SnapshotTable.SnapshotTooLargeException {
    if (record.key() == null) {
      badRecords.incrementAndGet();
      return;
    }
    byte[] key;
    byte[] value = null;
    try {
      key = keys == null ? record.key() : keys.toReaderBody(record.key());
      if (record.value() != null) {
        value = values.toReaderBody(record.value());
      }
    } catch (SingleObjectCodec.BadRecordException e) {
      long n = badRecords.incrementAndGet();
      if (n <= 10 || Long.bitCount(n) == 1) { // the first ten, then at powers of two: a log, not a flood
        LOG.warning(String.format("snapshot %s: skipped %s-%d@%d: %s (%d skipped so far)", spec.name(),
            record.topic(), record.partition(), record.offset(), e.getMessage(), n));
      }
      return;
    }
    table.apply(key, value); // a tombstone (null value) deletes
    if (value == null) {
      tombstones.incrementAndGet();
    }
    applied.incrementAndGet();
    lastAppliedTimestampMs = record.timestamp();
  }

  private static Schema parse(String json) {
    return new Schema.Parser().parse(json);
  }
}
