package threes.lookup;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.HashMap;
import java.util.Map;

/**
 * A store's table and the offsets it covers, in one local file: what Kafka Streams keeps for a global
 * store (its state directory and {@code .checkpoint} file), so a restarted JVM reads only the tail.
 *
 * <p>Written by the store's consumer thread between two polls, so the table is exactly the records
 * before the offsets; to a temporary file first, then renamed over the previous one (a crash leaves
 * the previous file whole). Layout: {@code int 2}, the topic ids ({@code int n}, then {@code UTF topic,
 * UTF id}), the offsets ({@code int n}, then {@code UTF topic, int partition, long offset}), the
 * entries ({@code long n}, then {@code int length, key bytes, int length, value bytes}).
 *
 * <p>The topic ids (Kafka's, KIP-516) tell a file of the topics the store reads from one of topics of
 * the same names deleted since: such a file is refused ({@link StaleFileException}), as is a file of
 * another version, and the store reads its topics from the beginning.
 */
final class StoreFile {
  private static final int VERSION = 2;

  private StoreFile() {}

  /** The file of a store in {@code stateDir}. */
  static Path path(String stateDir, StoreSpec spec) {
    return Path.of(stateDir, spec.storeId().replaceAll("[^A-Za-z0-9_.@-]", "_") + ".store");
  }

  /** A file that does not describe the topics the store reads now. */
  static final class StaleFileException extends IOException {
    private static final long serialVersionUID = 1L;

    StaleFileException(String message) {
      super(message);
    }
  }

  /**
   * Write {@code table}, the {@code topicIds} of its topics (topic to id) and {@code offsets}
   * ({@code topic:partition} to the next offset).
   */
  static void write(Path file, SnapshotTable table, Map<String, String> topicIds, Map<String, Long> offsets)
      throws IOException {
    Files.createDirectories(file.getParent());
    // per process: two executor JVMs of one host may write the same store's file; each writes a whole table
    Path tmp = file.resolveSibling(file.getFileName() + "." + ProcessHandle.current().pid() + ".tmp");
    try (DataOutputStream out = new DataOutputStream(new BufferedOutputStream(Files.newOutputStream(tmp), 1 << 16))) {
      out.writeInt(VERSION);
      out.writeInt(topicIds.size());
      for (Map.Entry<String, String> e : topicIds.entrySet()) {
        out.writeUTF(e.getKey());
        out.writeUTF(e.getValue());
      }
      out.writeInt(offsets.size());
      for (Map.Entry<String, Long> e : offsets.entrySet()) {
        int colon = e.getKey().lastIndexOf(':');
        out.writeUTF(e.getKey().substring(0, colon));
        out.writeInt(Integer.parseInt(e.getKey().substring(colon + 1)));
        out.writeLong(e.getValue());
      }
      out.writeLong(table.size());
      table.forEach((k, v) -> {
        try {
          out.writeInt(k.length);
          out.write(k);
          out.writeInt(v.length);
          out.write(v);
        } catch (IOException ex) {
          throw new java.io.UncheckedIOException(ex);
        }
      });
    }
    Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
  }

  /**
   * Load a file into an empty {@code table}, if it was written for the topics of {@code topicIds}.
   *
   * @param topicIds the ids the store's topics have now, topic to id
   * @return the offsets it covers, {@code topic:partition} to the next offset
   * @throws StaleFileException the file was written for other topics (of the same names: deleted
   *     and created again since) or by another version; nothing is loaded
   */
  static Map<String, Long> read(Path file, SnapshotTable table, Map<String, String> topicIds)
      throws IOException, SnapshotTable.SnapshotTooLargeException {
    Map<String, Long> offsets = new HashMap<>();
    try (DataInputStream in = new DataInputStream(new BufferedInputStream(Files.newInputStream(file), 1 << 16))) {
      int version = in.readInt();
      if (version != VERSION) {
        throw new StaleFileException(file + ": a store file of version " + version + ", not " + VERSION);
      }
      Map<String, String> written = new HashMap<>();
      int topics = in.readInt();
      for (int i = 0; i < topics; i++) {
        written.put(in.readUTF(), in.readUTF());
      }
      if (!written.equals(topicIds)) {
        throw new StaleFileException(String.format(
            "%s: written for topic ids %s, the topics have %s now (deleted and created again)", file, written,
            topicIds));
      }
      int partitions = in.readInt();
      for (int i = 0; i < partitions; i++) {
        String topic = in.readUTF();
        offsets.put(topic + ":" + in.readInt(), in.readLong());
      }
      long entries = in.readLong();
      for (long i = 0; i < entries; i++) {
        byte[] k = new byte[in.readInt()];
        in.readFully(k);
        byte[] v = new byte[in.readInt()];
        in.readFully(v);
        table.apply(k, v);
      }
    }
    return offsets;
  }
}
