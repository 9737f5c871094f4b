package threes.store;

import java.nio.ByteBuffer;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The latest value per key of one snapshot, in this JVM's heap, with a bound on its size.
 *
 * <p>Keys and values are canonical Avro bodies of the snapshot's reader schemas ({@link
 * SingleObjectCodec}); a tombstone removes its key. One writer (the store's consumer thread), any
 * number of readers (Spark's task threads): a {@link ConcurrentHashMap} gives them each key's latest
 * value without a lock, as a Kafka Streams global store gives its readers.
 *
 * <p><b>Memory.</b> An entry is counted as its key and value bytes plus {@link #ENTRY_OVERHEAD_BYTES}
 * (the hash map's node, a {@link ByteBuffer} around the key, two array headers: an estimate for a 64-bit
 * HotSpot with compressed pointers, not measured yet). A put that takes the total over {@code maxBytes} is refused with
 * {@link SnapshotTooLargeException}, naming both numbers: a snapshot that cannot fit stops the job at
 * start, not an executor with an {@link OutOfMemoryError} later.
 */
public final class SnapshotTable {
  /** Heap per entry beyond its key and value bytes, in bytes. */
  public static final long ENTRY_OVERHEAD_BYTES = 112;

  private final String name;
  private final long maxBytes;
  private final ConcurrentHashMap<ByteBuffer, byte[]> entries = new ConcurrentHashMap<>();
  private final AtomicLong bytes = new AtomicLong();

  /**
   * An empty table.
   *
   * @param name the snapshot's name (in errors)
   * @param maxBytes the most heap its entries may take, in bytes
   */
  public SnapshotTable(String name, long maxBytes) {
    this.name = name;
    this.maxBytes = maxBytes;
  }

  static long cost(byte[] key, byte[] value) {
    return key.length + (value == null ? 0 : value.length) + ENTRY_OVERHEAD_BYTES;
  }

  /**
   * Apply one record of a compacted topic: an upsert, or a delete when {@code value} is null.
   *
   * @throws SnapshotTooLargeException the upsert would take the entries over {@code maxBytes}; the
   *     table is left as it was
   */
  public void apply(byte[] key, byte[] value) throws SnapshotTooLargeException {
    ByteBuffer k = ByteBuffer.wrap(key);
    if (value == null) {
      byte[] old = entries.remove(k);
      if (old != null) {
        bytes.addAndGet(-cost(key, old));
      }
      return;
    }
    byte[] old = entries.get(k);
    long delta = cost(key, value) - (old == null ? 0 : cost(key, old));
    long after = bytes.get() + delta;
    if (after > maxBytes) {
      throw new SnapshotTooLargeException(
          String.format(
              "snapshot %s needs more than %d bytes of heap (%d keys held, %d bytes counted) but"
                  + " stream.snapshots[].max_bytes is %d: raise it (and the executors' memory) or use"
                  + " stream.mode: microbatch, whose partitioned snapshots are not bound by one JVM",
              name, after, entries.size(), bytes.get(), maxBytes));
    }
    entries.put(k, value);
    bytes.addAndGet(delta);
  }

  /** The value body of {@code key}, or null when the snapshot holds no such key. */
  public byte[] get(byte[] key) {
    return entries.get(ByteBuffer.wrap(key));
  }

  /** Keys held. */
  public int size() {
    return entries.size();
  }

  /** Heap counted for the entries, in bytes. */
  public long bytes() {
    return bytes.get();
  }

  /** The bound on {@link #bytes()}, in bytes. */
  public long maxBytes() {
    return maxBytes;
  }

  /** A snapshot does not fit the memory it is given. */
  public static final class SnapshotTooLargeException extends Exception {
    private static final long serialVersionUID = 1L;

    SnapshotTooLargeException(String message) {
      super(message);
    }
  }
}
