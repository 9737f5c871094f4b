package threes.store;

import java.io.IOException;
import java.io.Serializable;
import java.io.StringReader;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Properties;

/**
 * What an executor needs to build a snapshot's store: shipped inside the UDF, so plain strings.
 *
 * @param name the snapshot's name ({@code stream.snapshots[].name})
 * @param consumerConfig Kafka consumer settings in {@link Properties} text form ({@code key=value}
 *     lines): bootstrap servers and security
 * @param topics the compacted topics, comma-separated
 * @param schemaTopic the topic of the writer schemas
 * @param keySchema the reader key schema JSON; null for a snapshot keyed by plain UTF-8 strings
 * @param valueSchema the reader value schema JSON
 * @param maxBytes the heap the in-heap table of the latest values may take, in bytes; a snapshot larger than
 *     that is served from the RocksDB store alone (0: never keep an in-heap table)
 * @param readyTimeoutMs how long the first lookup waits for the store's first load, in milliseconds
 * @param startOffsets where to start reading ({@code topic:partition=offset}, comma-separated), e.g.
 *     from a checkpoint whose table was loaded beforehand; empty reads each topic from its beginning
 * @param stateDir a local folder under which the store keeps its RocksDB folder and offsets ({@link
 *     RocksState}), so a restarted JVM reads only the topics' tail; null or empty: a temporary folder,
 *     deleted when the store closes
 * @param retentionMs how long versions of a key stay queryable after they end ({@code as_of}), in
 *     milliseconds; negative keeps the latest value per key only
 */
public record StoreSpec(
    String name,
    String consumerConfig,
    String topics,
    String schemaTopic,
    String keySchema,
    String valueSchema,
    long maxBytes,
    long readyTimeoutMs,
    String startOffsets,
    String stateDir,
    long retentionMs)
    implements Serializable {

  /** The consumer settings. */
  public Properties consumerProperties() {
    Properties props = new Properties();
    try {
      props.load(new StringReader(consumerConfig == null ? "" : consumerConfig));
    } catch (IOException e) {
      throw new IllegalArgumentException("unreadable consumer settings of snapshot " + name, e);
    }
    return props;
  }

  /** The topics, in order. */
  public List<String> topicList() {
    return Arrays.stream(topics.split(",")).map(String::trim).filter(t -> !t.isEmpty()).toList();
  }

  /** {@code topic:partition} to the first offset to read. */
  public Map<String, Long> startOffsetMap() {
    Map<String, Long> out = new HashMap<>();
    if (startOffsets == null || startOffsets.isBlank()) {
      return out;
    }
    for (String item : startOffsets.split(",")) {
      int eq = item.lastIndexOf('=');
      out.put(item.substring(0, eq).trim(), Long.parseLong(item.substring(eq + 1).trim()));
    }
    return out;
  }

  /** Whether the store keeps versions ({@code retention}). */
  public boolean versioned() {
    return retentionMs >= 0;
  }

  /** What a persisted store was built from: a store of another fingerprint is rebuilt. */
  public String fingerprint() {
    try {
      byte[] digest = java.security.MessageDigest.getInstance("SHA-256").digest(
          String.join("\u0000", topics, String.valueOf(keySchema), valueSchema, Long.toString(retentionMs))
              .getBytes(java.nio.charset.StandardCharsets.UTF_8));
      return java.util.HexFormat.of().formatHex(digest);
    } catch (java.security.NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  /** The identity of a store in one JVM: two queries with the same spec share one store. */
  public String storeId() {
    return name + "@" + Integer.toHexString(Objects.hash(consumerConfig, topics, schemaTopic, keySchema, valueSchema,
        maxBytes, startOffsets, stateDir, retentionMs));
  }
}
