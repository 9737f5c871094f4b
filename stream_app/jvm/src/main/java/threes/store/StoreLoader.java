package threes.store;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
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
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.rocksdb.RocksDBException;
import org.rocksdb.WriteBatch;
import threes.avro.SchemaTopic;
import threes.avro.SingleObjectCodec;

/**
 * The consumer thread of a {@link SnapshotStore}: opens its {@link RocksState}, reads the tail of the
 * compacted topics into it, checkpoints, and watches the topics' ids.
 *
 * <p>Each poll's records and the offsets after them are one RocksDB write batch. The store is
 * checkpointed (an atomic flush) when it becomes ready, every {@link #CHECKPOINT_INTERVAL_MS}, and at
 * close. With {@code retention}, each record is also a version of its key, at its source time (the {@code
 * threes.source_ts} header, else the record's Kafka timestamp); at each checkpoint the versions of the
 * keys written since that ended before the horizon (newest record time minus the retention) are deleted.
 */
final class StoreLoader implements Runnable {
  private static final Logger LOG = Logger.getLogger(StoreLoader.class.getName());

  /** How often the store is checkpointed after it is ready, in milliseconds. */
  static final long CHECKPOINT_INTERVAL_MS = 30_000;

  /** How often the store checks that its topics were not deleted or created again, in milliseconds. */
  static final long TOPIC_CHECK_INTERVAL_MS = 10_000;

  /** The header of a record's source time (8 bytes, big-endian epoch ms), as the sources write it. */
  static final String SOURCE_TS_HEADER = "threes.source_ts";

  private final SnapshotStore store;
  private final StoreSpec spec;
  private final Set<ByteBuffer> touched = new HashSet<>();
  private volatile KafkaConsumer<byte[], byte[]> consumer;
  private SingleObjectCodec keys;
  private SingleObjectCodec values;
  private boolean heapToRebuild;
  private boolean temporary; // the store's folder is deleted at close (no state folder, or another JVM's lock)

  StoreLoader(SnapshotStore store) {
    this.store = store;
    this.spec = store.spec;
  }

  void wakeup() {
    KafkaConsumer<byte[], byte[]> c = consumer;
    if (c != null) {
      c.wakeup();
    }
  }

  @Override
  public void run() {
    long began = System.nanoTime();
    Properties props = spec.consumerProperties();
    props.put("key.deserializer", ByteArrayDeserializer.class.getName());
    props.put("value.deserializer", ByteArrayDeserializer.class.getName());
    props.put("enable.auto.commit", "false");
    props.put("allow.auto.create.topics", "false"); // a deleted topic stays deleted
    props.putIfAbsent("auto.offset.reset", "earliest");
    props.putIfAbsent("max.poll.records", "5000");
    props.putIfAbsent("fetch.max.bytes", String.valueOf(64 << 20));
    props.putIfAbsent("max.partition.fetch.bytes", String.valueOf(16 << 20));
    props.remove("group.id");
    Duration timeout = Duration.ofMillis(Math.max(10_000, spec.readyTimeoutMs()));
    SchemaTopic schemas = new SchemaTopic(spec.schemaTopic(), spec.consumerProperties(), timeout);
    RocksState state = null;
    try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props);
        Admin admin = Admin.create(adminProperties(props))) {
      consumer = c;
      if (store.closing) {
        return;
      }
      keys = spec.keySchema() == null ? null : new SingleObjectCodec(parse(spec.keySchema()), schemas::get, true);
      values = new SingleObjectCodec(parse(spec.valueSchema()), schemas::get, true);
      List<TopicPartition> partitions = partitions(c, timeout);
      Map<String, String> topicIds = topicIds(admin, spec.topicList(), timeout);
      state = open(topicIds);
      store.state = state;
      c.assign(partitions);
      seek(c, partitions, state.offsets());
      Map<TopicPartition, Long> end = new HashMap<>(c.endOffsets(partitions, timeout));
      loop(c, admin, state, partitions, end, topicIds, began);
    } catch (WakeupException e) {
      // close() before the loop
    } catch (Throwable e) {
      store.failure = e;
      LOG.log(Level.SEVERE, "snapshot " + spec.name() + " failed", e);
    } finally {
      consumer = null;
      store.ready.countDown();
      if (state != null) {
        closeState(state);
      }
    }
  }

  private RocksState open(Map<String, String> topicIds) throws IOException {
    Path folder = store.folder();
    temporary = store.temporary();
    RocksState state;
    try {
      state = RocksState.open(folder, spec.name(), spec.fingerprint(), topicIds);
    } catch (RocksState.StoreLockedException e) { // two executors of one host: the second keeps its own
      LOG.warning(e.getMessage() + "; this JVM keeps a temporary store instead");
      temporary = true;
      state = RocksState.open(java.nio.file.Files.createTempDirectory("threes-state-" + spec.name() + "-"),
          spec.name(), spec.fingerprint(), topicIds);
    }
    store.streamTimeMs = state.streamTime();
    // a load (from empty, or the tail after a restart) writes RocksDB alone, one copy per record; the in-heap
    // table is built from RocksDB once the store is ready (lookups read RocksDB meanwhile)
    heapToRebuild = store.heap != null;
    store.heap = null;
    if (!state.offsets().isEmpty()) {
      store.restoredKeys = state.estimatedKeys();
      SnapshotStore.log(String.format("snapshot %s: about %d keys restored from %s, reading the topics from %s",
          spec.name(), store.restoredKeys, folder, state.offsets()));
    }
    return state;
  }

  /**
   * The in-heap table, from RocksDB once the store is ready, until it no longer fits; lookups read RocksDB
   * meanwhile. Runs on this thread between two polls, so the table is exactly the store's state.
   */
  private void rebuildHeap(RocksState state) {
    long began = System.nanoTime();
    SnapshotTable heap = new SnapshotTable(spec.name(), spec.maxBytes());
    boolean[] fits = {true};
    state.forEachLatest((k, v) -> {
      try {
        heap.apply(k, v);
        return true;
      } catch (SnapshotTable.SnapshotTooLargeException tooLarge) {
        fits[0] = false;
        dropHeap(tooLarge);
        return false;
      }
    });
    if (fits[0]) {
      store.heap = heap;
      SnapshotStore.log(String.format("snapshot %s: %d keys in the in-heap table again in %d ms", spec.name(),
          heap.size(), (System.nanoTime() - began) / 1_000_000));
    }
  }

  private List<TopicPartition> partitions(KafkaConsumer<byte[], byte[]> c, Duration timeout) {
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
    return partitions;
  }

  private void seek(KafkaConsumer<byte[], byte[]> c, List<TopicPartition> partitions, Map<String, Long> stored) {
    Map<String, Long> start = stored.isEmpty() ? spec.startOffsetMap() : stored;
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
  }

  private void loop(KafkaConsumer<byte[], byte[]> c, Admin admin, RocksState state, List<TopicPartition> partitions,
      Map<TopicPartition, Long> end, Map<String, String> topicIds, long began) throws Exception {
    long checkpointed = System.currentTimeMillis();
    long nextCheck = checkpointed + TOPIC_CHECK_INTERVAL_MS;
    Map<String, KafkaFuture<TopicDescription>> check = null;
    try {
      while (!store.closing) {
        if (check == null && System.currentTimeMillis() >= nextCheck) {
          check = admin.describeTopics(spec.topicList()).topicNameValues(); // answered while polling
        } else if (check != null && check.values().stream().allMatch(KafkaFuture::isDone)) {
          verifyTopics(check, topicIds);
          check = null;
          nextCheck = System.currentTimeMillis() + TOPIC_CHECK_INTERVAL_MS;
        }
        if (store.ready.getCount() > 0 && SchemaTopic.reached(c, end)) {
          checkpoint(state);
          checkpointed = System.currentTimeMillis();
          store.readyMs = (System.nanoTime() - began) / 1_000_000;
          SnapshotStore.log(String.format("snapshot %s ready: %d keys (%s), %d records in %d ms", spec.name(),
              store.keys(), store.engine(), store.applied.get(), store.readyMs));
          store.ready.countDown();
          if (heapToRebuild) {
            heapToRebuild = false;
            rebuildHeap(state);
          }
        }
        ConsumerRecords<byte[], byte[]> batch = c.poll(Duration.ofMillis(store.ready.getCount() > 0 ? 100 : 20));
        if (!batch.isEmpty()) {
          apply(c, state, batch);
        }
        if (store.ready.getCount() == 0 && System.currentTimeMillis() - checkpointed >= CHECKPOINT_INTERVAL_MS) {
          checkpoint(state);
          checkpointed = System.currentTimeMillis();
        }
      }
    } catch (WakeupException e) {
      // close(): the consumer was woken to stop
    }
  }

  private void apply(KafkaConsumer<byte[], byte[]> c, RocksState state, ConsumerRecords<byte[], byte[]> batch)
      throws RocksDBException {
    List<byte[][]> decoded = new ArrayList<>(batch.count());
    try (WriteBatch write = new WriteBatch()) {
      for (ConsumerRecord<byte[], byte[]> record : batch) {
        byte[][] kv = decode(record);
        if (kv == null) {
          continue;
        }
        state.putLatest(write, kv[0], kv[1]);
        if (spec.versioned()) {
          long at = sourceTime(record);
          state.putVersion(write, kv[0], at, record.partition(), record.offset(), kv[1]);
          touched.add(ByteBuffer.wrap(kv[0]));
          store.streamTimeMs = Math.max(store.streamTimeMs, at);
        }
        decoded.add(kv);
        store.lastAppliedTimestampMs = record.timestamp();
      }
      if (spec.versioned() && store.streamTimeMs != Long.MIN_VALUE) {
        state.putStreamTime(write, store.streamTimeMs);
      }
      for (TopicPartition tp : batch.partitions()) {
        long next = c.position(tp);
        state.putOffset(write, tp.topic(), tp.partition(), next);
        store.positions.put(tp.topic() + ":" + tp.partition(), next);
      }
      state.write(write);
    }
    SnapshotTable heap = store.heap; // after RocksDB: a dropped heap leaves readers on a complete store
    for (byte[][] kv : decoded) {
      if (heap != null) {
        try {
          heap.apply(kv[0], kv[1]);
        } catch (SnapshotTable.SnapshotTooLargeException tooLarge) {
          dropHeap(tooLarge);
          heap = null;
        }
      }
      if (kv[1] == null) {
        store.tombstones.incrementAndGet();
      }
      store.applied.incrementAndGet();
    }
  }

  private void dropHeap(SnapshotTable.SnapshotTooLargeException tooLarge) {
    store.heap = null;
    SnapshotStore.log(String.format("snapshot %s: served from RocksDB alone from now on: %s", spec.name(),
        tooLarge.getMessage()));
  }

  /** Key and value bodies of a record (value null for a tombstone), or null for a record it cannot read. */
  private byte[][] decode(ConsumerRecord<byte[], byte[]> record) {
    if (record.key() == null) {
      store.badRecords.incrementAndGet();
      return null;
    }
    try {
      byte[] key = keys == null ? record.key() : keys.toReaderBody(record.key());
      byte[] value = record.value() == null ? null : values.toReaderBody(record.value());
      return new byte[][] {key, value};
    } catch (SingleObjectCodec.BadRecordException e) {
      long n = store.badRecords.incrementAndGet();
      if (n <= 10 || Long.bitCount(n) == 1) { // the first ten, then at powers of two: a log, not a flood
        LOG.warning(String.format("snapshot %s: skipped %s-%d@%d: %s (%d skipped so far)", spec.name(),
            record.topic(), record.partition(), record.offset(), e.getMessage(), n));
      }
      return null;
    }
  }

  /** A record's source time: the {@code threes.source_ts} header, else its Kafka timestamp (epoch ms). */
  static long sourceTime(ConsumerRecord<byte[], byte[]> record) {
    Header header = record.headers().lastHeader(SOURCE_TS_HEADER);
    if (header != null && header.value() != null && header.value().length == 8) {
      return ByteBuffer.wrap(header.value()).getLong();
    }
    return record.timestamp();
  }

  private void checkpoint(RocksState state) throws RocksDBException {
    if (spec.versioned() && !touched.isEmpty()) {
      long horizon = store.horizonMs();
      for (ByteBuffer key : touched) {
        state.prune(key.array(), horizon);
      }
      touched.clear();
    }
    state.checkpoint();
  }

  private void closeState(RocksState state) {
    try {
      if (store.failure == null && store.ready.getCount() == 0) {
        checkpoint(state); // a restart then reads only what came after
      }
    } catch (RocksDBException | RuntimeException e) {
      LOG.log(Level.WARNING, "snapshot " + spec.name() + ": cannot checkpoint at close", e);
    }
    state.close();
    if (temporary) {
      try {
        RocksState.delete(state.dir());
      } catch (IOException e) {
        LOG.fine("snapshot " + spec.name() + ": cannot delete " + state.dir() + ": " + e);
      }
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

  /** The ids of {@code topics} now, topic to id. */
  static Map<String, String> topicIds(Admin admin, List<String> topics, Duration timeout) throws Exception {
    Map<String, String> ids = new HashMap<>();
    try {
      Map<String, TopicDescription> described =
          admin.describeTopics(topics).allTopicNames().get(timeout.toMillis(), TimeUnit.MILLISECONDS);
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

  private static Schema parse(String json) {
    return new Schema.Parser().parse(json);
  }
}
