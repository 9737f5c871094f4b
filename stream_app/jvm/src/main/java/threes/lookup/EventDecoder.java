package threes.lookup;

import threes.avro.SchemaTopic;
import threes.avro.SingleObjectCodec;

import java.io.IOException;
import java.io.StringReader;
import java.time.Duration;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Function;
import org.apache.avro.Schema;

/**
 * Decodes the events of a real-time query: single-object Avro records to bare bodies of the events'
 * reader schema, resolving each writer schema from the schema topic when it is first seen.
 *
 * <p>A micro-batch query learns new writer schemas between micro-batches; a real-time query runs
 * one long epoch after another, so it cannot. Here, as in a Kafka deserializer backed by a schema
 * registry, a fingerprint not seen yet re-reads the schema topic ({@link SchemaTopic#get}): a producer
 * registers its writer schema before it writes with it, so an event is never dead-lettered for a
 * writer registered after the query started. A fingerprint still unknown after that read is
 * remembered for {@link #MISS_RETRY_MS} so a run of corrupt records does not re-read the topic per
 * record.
 *
 * <p>One decoder per (schema topic, consumer settings, reader schema) per JVM ({@link #of}); the
 * schema topic's reader is shared by every decoder of that topic. Thread-safe: each task thread
 * gets its own codec.
 */
public final class EventDecoder {
  /** How long a fingerprint the schema topic did not hold is not looked up again, in milliseconds. */
  static final long MISS_RETRY_MS = 1_000;

  /** How long one read of the schema topic may take. */
  static final Duration READ_TIMEOUT = Duration.ofSeconds(60);

  private static final Map<String, SchemaTopic> TOPICS = new ConcurrentHashMap<>();
  private static final Map<String, EventDecoder> DECODERS = new ConcurrentHashMap<>();

  private final Function<String, Schema> writers;
  private final ThreadLocal<SingleObjectCodec> codecs;
  private final Map<String, Long> missedAt = new ConcurrentHashMap<>();

  EventDecoder(Schema reader, Function<String, Schema> writers) {
    this.writers = writers;
    this.codecs = ThreadLocal.withInitial(() -> new SingleObjectCodec(reader, this::writer));
  }

  /**
   * The decoder of one events reader schema in this JVM.
   *
   * @param schemaTopic the topic of the writer schemas
   * @param consumerConfig Kafka consumer settings in {@link Properties} text form
   * @param readerSchema the events' reader schema JSON ({@code stream.events.value_schema})
   */
  public static EventDecoder of(String schemaTopic, String consumerConfig, String readerSchema) {
    String id = schemaTopic + "\n" + consumerConfig + "\n" + readerSchema;
    return DECODERS.computeIfAbsent(id, k -> {
      SchemaTopic topic = TOPICS.computeIfAbsent(schemaTopic + "\n" + consumerConfig,
          t -> new SchemaTopic(schemaTopic, properties(consumerConfig), READ_TIMEOUT));
      return new EventDecoder(new Schema.Parser().parse(readerSchema), topic::get);
    });
  }

  private Schema writer(String fingerprintHex) {
    Long missed = missedAt.get(fingerprintHex);
    if (missed != null && System.currentTimeMillis() - missed < MISS_RETRY_MS) {
      return null;
    }
    Schema schema = writers.apply(fingerprintHex);
    if (schema == null) {
      missedAt.put(fingerprintHex, System.currentTimeMillis());
    } else {
      missedAt.remove(fingerprintHex);
    }
    return schema;
  }

  /**
   * The event's body in the reader schema.
   *
   * @param data the Kafka record's value (single-object Avro)
   * @return the bare Avro body of the reader schema; null for a null value or a record that does not
   *     decode ({@link #error} says why)
   */
  public byte[] decode(byte[] data) {
    if (data == null) {
      return null;
    }
    try {
      return codecs.get().toReaderBody(data);
    } catch (SingleObjectCodec.BadRecordException e) {
      return null;
    }
  }

  /**
   * Why the event does not decode, in the words of a dead letter's reason.
   *
   * @param data the Kafka record's value
   * @return the reason, or null when it decodes
   */
  public String error(byte[] data) {
    if (data == null) {
      return "event has no value (null)";
    }
    String fp = SingleObjectCodec.fingerprintHex(data);
    if (fp == null) {
      return "value is not Avro single-object encoding (no C3 01 marker)";
    }
    try {
      codecs.get().toReaderBody(data);
      return null;
    } catch (SingleObjectCodec.BadRecordException e) {
      // the same words as a micro-batch's dead letters (stream_app.snapshot.data.decode_error_reason)
      if (writer(fp) == null) {
        return "value has an unknown writer schema fingerprint " + fp;
      }
      return "value does not decode with its writer schema " + fp + ": " + e.getMessage();
    }
  }

  private static Properties properties(String text) {
    Properties props = new Properties();
    try {
      props.load(new StringReader(text == null ? "" : text));
    } catch (IOException e) {
      throw new IllegalArgumentException("unreadable consumer settings of the events decoder", e);
    }
    return props;
  }
}
