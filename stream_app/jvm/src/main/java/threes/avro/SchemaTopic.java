package threes.avro;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Pattern;
import org.apache.avro.Schema;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Writer schemas by fingerprint, read from the project's schema topic ({@code schemas/store.py}).
 *
 * <p>Key: the fingerprint as 16 lowercase hex characters; value: the full schema JSON. Records keyed
 * {@code subject:...} (subject versions) are skipped. A fingerprint not seen yet re-reads the topic to
 * its end, the way Kafka Connect workers read {@code connect-configs}: a source that registers a new
 * writer schema does so before it writes records with it.
 */
public final class SchemaTopic {
  private static final Pattern FINGERPRINT = Pattern.compile("[0-9a-f]{16}");

  private final String topic;
  private final Properties consumerProps;
  private final Duration timeout;
  private final Map<String, Schema> schemas = new ConcurrentHashMap<>();

  /**
   * A reader of one schema topic.
   *
   * @param topic the schema topic (e.g. {@code _threes_schemas})
   * @param consumerProps Kafka consumer settings (bootstrap servers, security); deserializers are set
   *     here
   * @param timeout how long one read to the end may take
   */
  public SchemaTopic(String topic, Properties consumerProps, Duration timeout) {
    this.topic = topic;
    this.consumerProps = consumerProps;
    this.timeout = timeout;
  }

  /** The writer schema of a fingerprint, reading the topic again when it is not known; null if absent. */
  public Schema get(String fingerprintHex) {
    Schema schema = schemas.get(fingerprintHex);
    if (schema == null) {
      refresh();
      schema = schemas.get(fingerprintHex);
    }
    return schema;
  }

  /** Put a writer schema (tests, or schemas known up front). */
  public void put(String fingerprintHex, Schema schema) {
    schemas.put(fingerprintHex, schema);
  }

  /** Read the topic from its beginning to its current end. */
  public synchronized void refresh() {
    Properties props = new Properties();
    props.putAll(consumerProps);
    props.put("key.deserializer", ByteArrayDeserializer.class.getName());
    props.put("value.deserializer", ByteArrayDeserializer.class.getName());
    props.put("enable.auto.commit", "false");
    props.remove("group.id");
    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
      List<TopicPartition> partitions = new ArrayList<>();
      List<PartitionInfo> infos = consumer.partitionsFor(topic, timeout);
      if (infos == null) {
        return;
      }
      for (PartitionInfo info : infos) {
        partitions.add(new TopicPartition(topic, info.partition()));
      }
      consumer.assign(partitions);
      consumer.seekToBeginning(partitions);
      Map<TopicPartition, Long> end = consumer.endOffsets(partitions, timeout);
      long deadline = System.nanoTime() + timeout.toNanos();
      while (!reached(consumer, end)) {
        if (System.nanoTime() > deadline) {
          throw new IllegalStateException("schema topic " + topic + " not read to its end within " + timeout);
        }
        for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(200))) {
          if (record.key() == null || record.value() == null) {
            continue;
          }
          String key = new String(record.key(), StandardCharsets.UTF_8);
          if (FINGERPRINT.matcher(key).matches()) {
            // a parser per schema: named types of one writer schema must not clash with another's
            schemas.put(key, new Schema.Parser().parse(new String(record.value(), StandardCharsets.UTF_8)));
          }
        }
      }
    }
  }

  /** Whether {@code consumer} has read every partition of {@code end} up to its end offset. */
  public static boolean reached(KafkaConsumer<?, ?> consumer, Map<TopicPartition, Long> end) {
    for (Map.Entry<TopicPartition, Long> e : end.entrySet()) {
      if (consumer.position(e.getKey()) < e.getValue()) {
        return false;
      }
    }
    return true;
  }
}
