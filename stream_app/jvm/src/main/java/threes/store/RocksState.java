package threes.store;

import static java.nio.charset.StandardCharsets.UTF_8;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.BiConsumer;
import java.util.logging.Logger;
import java.util.stream.Stream;
import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.ColumnFamilyDescriptor;
import org.rocksdb.ColumnFamilyHandle;
import org.rocksdb.ColumnFamilyOptions;
import org.rocksdb.CompressionType;
import org.rocksdb.DBOptions;
import org.rocksdb.FlushOptions;
import org.rocksdb.LRUCache;
import org.rocksdb.RocksDB;
import org.rocksdb.RocksDBException;
import org.rocksdb.RocksIterator;
import org.rocksdb.Status;
import org.rocksdb.WriteBatch;
import org.rocksdb.WriteOptions;

/**
 * The persistent half of a snapshot's state store: RocksDB in a local folder, three column families.
 *
 * <ul>
 *   <li>{@code latest}: key body to value body, the latest value per key (a tombstone deletes).
 *   <li>{@code versions} (a versioned snapshot only, KIP-889): {@link VersionKey} (key, valid from,
 *       source position) to a version ({@code 0} tombstone, or {@code 1} then the value body); a
 *       version's validity ends where the key's next version starts.
 *   <li>{@code default}: the store's metadata: its format, the fingerprint of what it was built from
 *       (topics, schemas, retention), the Kafka topic ids (KIP-516) and, per partition, the next offset
 *       the data covers.
 * </ul>
 *
 * <p><b>Checkpoints without a write-ahead log.</b> Every write skips RocksDB's WAL (as a bulk load, and
 * as Kafka Streams' restore does); the data and the offsets of one poll go in one {@link WriteBatch}, and
 * flushes are atomic across the column families ({@code atomic_flush}). What is on disk after any crash
 * is therefore the records before some offsets, and those offsets: a restart reads the topics from
 * there. Applying a record twice leaves the same state (a version's key includes its offset), so a
 * checkpoint older than some flushed data is safe.
 *
 * <p><b>Never answers wrongly.</b> A folder RocksDB cannot open (a corrupt or truncated file), of another
 * format, built from other topics or schemas, or of topics deleted and created again since, is deleted and
 * rebuilt from the topics, with a warning. A full disk fails the write with {@link StoreFullException}.
 */
public final class RocksState implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(RocksState.class.getName());
  private static final byte[] LATEST = "latest".getBytes(UTF_8);
  private static final byte[] VERSIONS = "versions".getBytes(UTF_8);
  private static final byte[] FORMAT_KEY = "format".getBytes(UTF_8);
  private static final byte[] FINGERPRINT_KEY = "fingerprint".getBytes(UTF_8);
  private static final byte[] STREAM_TIME_KEY = "stream-time".getBytes(UTF_8);
  private static final String OFFSET_PREFIX = "offset/";
  private static final String TOPIC_ID_PREFIX = "topic-id/";
  private static final byte[] FORMAT = "threes-state-1".getBytes(UTF_8);

  static {
    RocksDB.loadLibrary();
  }

  private final Path dir;
  private final String name;
  private final LRUCache cache;
  private final DBOptions dbOptions;
  private final ColumnFamilyOptions cfOptions;
  private final WriteOptions writeOptions = new WriteOptions().setDisableWAL(true);
  private final RocksDB db;
  private final ColumnFamilyHandle meta;
  private final ColumnFamilyHandle latest;
  private final ColumnFamilyHandle versions;
  private final List<ColumnFamilyHandle> handles;
  private final boolean rebuilt;

  private RocksState(Path dir, String name, boolean rebuilt) throws RocksDBException {
    this.dir = dir;
    this.name = name;
    this.rebuilt = rebuilt;
    this.cache = new LRUCache(64L << 20);
    BlockBasedTableConfig table = new BlockBasedTableConfig().setBlockCache(cache).setBlockSize(16 << 10)
        .setCacheIndexAndFilterBlocks(true).setFilterPolicy(new org.rocksdb.BloomFilter(10, false));
    this.cfOptions = new ColumnFamilyOptions().setTableFormatConfig(table).setWriteBufferSize(32L << 20)
        .setMaxWriteBufferNumber(3).setCompressionType(CompressionType.LZ4_COMPRESSION)
        .setLevelCompactionDynamicLevelBytes(true);
    this.dbOptions = new DBOptions().setCreateIfMissing(true).setCreateMissingColumnFamilies(true)
        .setAtomicFlush(true).setParanoidChecks(true).setMaxBackgroundJobs(2).setKeepLogFileNum(2);
    List<ColumnFamilyDescriptor> descriptors = List.of(
        new ColumnFamilyDescriptor(RocksDB.DEFAULT_COLUMN_FAMILY, cfOptions),
        new ColumnFamilyDescriptor(LATEST, cfOptions),
        new ColumnFamilyDescriptor(VERSIONS, cfOptions));
    this.handles = new ArrayList<>();
    this.db = RocksDB.open(dbOptions, dir.toString(), descriptors, handles);
    this.meta = handles.get(0);
    this.latest = handles.get(1);
    this.versions = handles.get(2);
  }

  /**
   * Open the store in {@code dir}, or build it empty when what is there cannot be trusted.
   *
   * @param dir the store's folder (created when missing)
   * @param name the snapshot's name, in logs and errors
   * @param fingerprint what the store is built from (topics, schemas, retention): another one rebuilds
   * @param topicIds the topics' ids now, topic to id: a stored id that differs rebuilds
   * @return the store; {@link #offsets()} is empty when it starts empty
   * @throws StoreFullException the disk is full
   * @throws StoreLockedException another process has the folder open
   * @throws IOException the folder cannot be created or deleted
   */
  public static RocksState open(Path dir, String name, String fingerprint, Map<String, String> topicIds)
      throws IOException {
    Files.createDirectories(dir);
    boolean empty;
    try (Stream<Path> entries = Files.list(dir)) {
      empty = entries.findAny().isEmpty();
    }
    String reason;
    try {
      RocksState state = new RocksState(dir, name, false);
      reason = state.distrust(fingerprint, topicIds);
      if (reason == null) {
        return state;
      }
      state.close();
    } catch (RocksDBException e) {
      StoreFullException.check(e, name, dir);
      String text = String.valueOf(e.getMessage()).toLowerCase(java.util.Locale.ROOT);
      if (text.contains("lock")) { // another process holds it: never delete a live store
        throw new StoreLockedException("snapshot " + name + ": the state store " + dir + " is open in another "
            + "process (" + e.getMessage() + ")");
      }
      reason = "RocksDB cannot open it (" + e.getMessage() + ")";
    }
    if (!empty) {
      LOG.warning(String.format("snapshot %s: the state store in %s is rebuilt from the topics: %s", name, dir,
          reason));
    }
    delete(dir);
    Files.createDirectories(dir);
    try {
      RocksState fresh = new RocksState(dir, name, !empty);
      WriteBatch batch = new WriteBatch();
      batch.put(fresh.meta, FORMAT_KEY, FORMAT);
      batch.put(fresh.meta, FINGERPRINT_KEY, fingerprint.getBytes(UTF_8));
      for (Map.Entry<String, String> id : topicIds.entrySet()) {
        batch.put(fresh.meta, (TOPIC_ID_PREFIX + id.getKey()).getBytes(UTF_8), id.getValue().getBytes(UTF_8));
      }
      fresh.write(batch);
      fresh.checkpoint();
      return fresh;
    } catch (RocksDBException e) {
      StoreFullException.check(e, name, dir);
      throw new IOException("snapshot " + name + ": cannot create the state store in " + dir + ": " + e.getMessage(),
          e);
    }
  }

  /** Why the opened store cannot be used as it is, or null when it can. */
  private String distrust(String fingerprint, Map<String, String> topicIds) throws RocksDBException {
    byte[] format = db.get(meta, FORMAT_KEY);
    if (format == null) {
      return "it holds no complete store";
    }
    if (!java.util.Arrays.equals(format, FORMAT)) {
      return "it is of format " + new String(format, UTF_8);
    }
    byte[] fp = db.get(meta, FINGERPRINT_KEY);
    if (fp == null || !fingerprint.equals(new String(fp, UTF_8))) {
      return "it was built from other topics, schemas or retention";
    }
    Map<String, String> stored = new HashMap<>();
    scanMeta(TOPIC_ID_PREFIX, (k, v) -> stored.put(k, v == null ? null : new String(v, UTF_8)));
    if (!stored.equals(topicIds)) {
      return "its topics were deleted and created again since (topic ids " + stored + ", now " + topicIds + ")";
    }
    return null;
  }

  /** Whether the folder held a store that could not be trusted and was deleted (see {@link #open}). */
  public boolean rebuilt() {
    return rebuilt;
  }

  /** {@code topic:partition} to the next offset the stored data covers; empty for a new store. */
  public Map<String, Long> offsets() {
    Map<String, Long> out = new HashMap<>();
    try {
      scanMeta(OFFSET_PREFIX, (k, v) -> out.put(k, ByteBuffer.wrap(v).getLong()));
    } catch (RocksDBException e) {
      throw new IllegalStateException(e);
    }
    return out;
  }

  private void scanMeta(String prefix, BiConsumer<String, byte[]> visitor) throws RocksDBException {
    byte[] p = prefix.getBytes(UTF_8);
    try (RocksIterator it = db.newIterator(meta)) {
      for (it.seek(p); it.isValid() && VersionKey.startsWith(it.key(), p); it.next()) {
        String k = new String(it.key(), UTF_8).substring(prefix.length());
        visitor.accept(k, it.value());
      }
      it.status();
    }
  }

  /** Record in {@code batch} that the data covers {@code topic-partition} up to {@code next} (exclusive). */
  public void putOffset(WriteBatch batch, String topic, int partition, long next) throws RocksDBException {
    batch.put(meta, (OFFSET_PREFIX + topic + ":" + partition).getBytes(UTF_8),
        ByteBuffer.allocate(8).putLong(next).array());
  }

  /** Record in {@code batch} the newest source time applied (a versioned store's stream time), epoch ms. */
  public void putStreamTime(WriteBatch batch, long ms) throws RocksDBException {
    batch.put(meta, STREAM_TIME_KEY, ByteBuffer.allocate(8).putLong(ms).array());
  }

  /** The stream time stored with the data, epoch ms; {@link Long#MIN_VALUE} when none. */
  public long streamTime() {
    try {
      byte[] v = db.get(meta, STREAM_TIME_KEY);
      return v == null ? Long.MIN_VALUE : ByteBuffer.wrap(v).getLong();
    } catch (RocksDBException e) {
      throw new IllegalStateException(e);
    }
  }

  /** Put or delete (null {@code value}) the latest value of {@code key} in {@code batch}. */
  public void putLatest(WriteBatch batch, byte[] key, byte[] value) throws RocksDBException {
    if (value == null) {
      batch.delete(latest, key);
    } else {
      batch.put(latest, key, value);
    }
  }

  /** Add a version of {@code key} (a tombstone when {@code value} is null) to {@code batch}. */
  public void putVersion(WriteBatch batch, byte[] key, long validFromMs, int partition, long offset, byte[] value)
      throws RocksDBException {
    batch.put(versions, VersionKey.of(key, validFromMs, partition, offset), VersionKey.versionValue(value));
  }

  /** Apply {@code batch}, without the write-ahead log. */
  public void write(WriteBatch batch) throws RocksDBException {
    try {
      db.write(writeOptions, batch);
    } catch (RocksDBException e) {
      StoreFullException.check(e, name, dir);
      throw e;
    }
  }

  /** The latest value body of {@code key}, or null. */
  public byte[] latest(byte[] key) {
    try {
      return db.get(latest, key);
    } catch (RocksDBException e) {
      throw new IllegalStateException("snapshot " + name + ": cannot read the state store: " + e.getMessage(), e);
    }
  }

  /**
   * The version of {@code key} valid at {@code atMs}: the last one whose validity starts at or before it
   * (at equal times, the later offset wins, as a later record of a compacted topic does).
   *
   * @return the version, or null when the key had none then (never written, or a tombstone)
   */
  public Version versionAt(byte[] key, long atMs) {
    byte[] prefix = VersionKey.prefix(key);
    try (RocksIterator it = db.newIterator(versions)) {
      it.seekForPrev(VersionKey.of(key, atMs, Integer.MAX_VALUE, Long.MAX_VALUE));
      if (!it.isValid() || !VersionKey.startsWith(it.key(), prefix)) {
        return null;
      }
      long from = VersionKey.validFrom(it.key(), prefix.length);
      byte[] value = VersionKey.valueOf(it.value());
      long to = Long.MAX_VALUE;
      for (it.next(); it.isValid() && VersionKey.startsWith(it.key(), prefix); it.next()) {
        long next = VersionKey.validFrom(it.key(), prefix.length);
        if (next > from) {
          to = next;
          break;
        }
      }
      return value == null ? null : new Version(from, to, value);
    }
  }

  /**
   * Delete the versions of {@code key} that ended at or before {@code horizonMs} (a version's end is the
   * next version's start), keeping the one valid at the horizon.
   */
  public void prune(byte[] key, long horizonMs) throws RocksDBException {
    byte[] prefix = VersionKey.prefix(key);
    List<byte[]> keys = new ArrayList<>();
    try (RocksIterator it = db.newIterator(versions)) {
      for (it.seek(prefix); it.isValid() && VersionKey.startsWith(it.key(), prefix); it.next()) {
        keys.add(it.key());
      }
    }
    int keep = keys.size() - 1; // the newest always stays
    while (keep > 0 && VersionKey.validFrom(keys.get(keep), prefix.length) > horizonMs) {
      keep--;
    }
    if (keep <= 0) {
      return;
    }
    try (WriteBatch batch = new WriteBatch()) {
      for (int i = 0; i < keep; i++) {
        batch.delete(versions, keys.get(i));
      }
      write(batch);
    }
  }

  /**
   * Up to {@code limit} latest entries with {@code from <= key < to} in the store's key order (the key
   * bodies' bytes, unsigned: UTF-8 order for string keys). A null bound is open.
   */
  public List<byte[][]> range(byte[] from, byte[] to, int limit) {
    List<byte[][]> out = new ArrayList<>();
    Comparator<byte[]> order = java.util.Arrays::compareUnsigned;
    try (RocksIterator it = db.newIterator(latest)) {
      if (from == null) {
        it.seekToFirst();
      } else {
        it.seek(from);
      }
      for (; it.isValid() && out.size() < limit; it.next()) {
        if (to != null && order.compare(it.key(), to) >= 0) {
          break;
        }
        out.add(new byte[][] {it.key(), it.value()});
      }
    }
    return out;
  }

  /** Visit the latest entries in key order while {@code visitor} returns true. */
  public void forEachLatest(java.util.function.BiPredicate<byte[], byte[]> visitor) {
    try (RocksIterator it = db.newIterator(latest)) {
      for (it.seekToFirst(); it.isValid(); it.next()) {
        if (!visitor.test(it.key(), it.value())) {
          return;
        }
      }
    }
  }

  /**
   * Make everything written so far durable with its offsets: an atomic flush of the memtables.
   *
   * @throws StoreFullException the disk is full
   */
  public void checkpoint() throws RocksDBException {
    try (FlushOptions options = new FlushOptions().setWaitForFlush(true)) {
      db.flush(options, handles);
    } catch (RocksDBException e) {
      StoreFullException.check(e, name, dir);
      throw e;
    }
  }

  /** RocksDB's estimate of the latest keys held. */
  public long estimatedKeys() {
    try {
      return db.getLongProperty(latest, "rocksdb.estimate-num-keys");
    } catch (RocksDBException e) {
      return -1;
    }
  }

  /** The bytes of the store's files on disk. */
  public long diskBytes() {
    try (Stream<Path> files = Files.walk(dir)) {
      return files.filter(Files::isRegularFile).mapToLong(p -> p.toFile().length()).sum();
    } catch (IOException | java.io.UncheckedIOException e) {
      return -1;
    }
  }

  /** The store's folder. */
  public Path dir() {
    return dir;
  }

  @Override
  public void close() {
    for (ColumnFamilyHandle h : handles) {
      h.close();
    }
    db.close();
    writeOptions.close();
    dbOptions.close();
    cfOptions.close();
    cache.close();
  }

  /** Delete {@code dir} and everything under it (nothing when it does not exist). */
  static void delete(Path dir) throws IOException {
    if (!Files.exists(dir)) {
      return;
    }
    try (Stream<Path> walk = Files.walk(dir)) {
      for (Path p : walk.sorted(Comparator.reverseOrder()).toList()) {
        Files.deleteIfExists(p);
      }
    }
  }

  /**
   * One version of a key.
   *
   * @param validFromMs where its validity starts, epoch ms (inclusive)
   * @param validToMs where it ends, epoch ms (exclusive); {@link Long#MAX_VALUE} for the current version
   * @param value its value body
   */
  public record Version(long validFromMs, long validToMs, byte[] value) {}

  /** The folder of a state store is held by another process (RocksDB's {@code LOCK} file). */
  public static final class StoreLockedException extends IOException {
    private static final long serialVersionUID = 1L;

    StoreLockedException(String message) {
      super(message);
    }
  }

  /** The disk of a state store is full: writes fail, and the store with them. */
  public static final class StoreFullException extends IllegalStateException {
    private static final long serialVersionUID = 1L;

    StoreFullException(String message, Throwable cause) {
      super(message, cause);
    }

    static void check(RocksDBException e, String name, Path dir) {
      Status status = e.getStatus();
      String text = String.valueOf(e.getMessage()) + (status == null ? "" : " " + status.getState());
      if (text.contains("No space left") || text.contains("ENOSPC")
          || (status != null && status.getSubCode() == Status.SubCode.NoSpace)) {
        throw new StoreFullException(String.format("snapshot %s: the disk of the state store %s is full (%s): free "
            + "space there or move the state folder to another disk; the store stops rather than answer from a partial "
            + "table", name, dir, e.getMessage()), e);
      }
    }
  }
}
