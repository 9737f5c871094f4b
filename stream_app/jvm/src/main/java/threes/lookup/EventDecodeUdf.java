package threes.lookup;

import org.apache.spark.sql.api.java.UDF1;

/**
 * The events' decode step of a real-time query as a Spark UDF: single-object Avro in, the bare body
 * of the events' reader schema out (null when it does not decode), for Spark's {@code from_avro}
 * with the reader schema. With {@code reasons} set, it gives instead why a record does not decode
 * (null when it does), the dead letter's reason. See {@link EventDecoder}.
 */
public final class EventDecodeUdf implements UDF1<byte[], Object> {
  private static final long serialVersionUID = 1L;

  private final String schemaTopic;
  private final String consumerConfig;
  private final String readerSchema;
  private final boolean reasons;
  private transient volatile EventDecoder decoder;

  /**
   * A decode step.
   *
   * @param schemaTopic the topic of the writer schemas
   * @param consumerConfig Kafka consumer settings in {@code Properties} text form
   * @param readerSchema the events' reader schema JSON
   * @param reasons true: the UDF returns the reason a record does not decode (a string), not its body
   */
  public EventDecodeUdf(String schemaTopic, String consumerConfig, String readerSchema, boolean reasons) {
    this.schemaTopic = schemaTopic;
    this.consumerConfig = consumerConfig;
    this.readerSchema = readerSchema;
    this.reasons = reasons;
  }

  @Override
  public Object call(byte[] value) {
    EventDecoder d = decoder;
    if (d == null) {
      d = EventDecoder.of(schemaTopic, consumerConfig, readerSchema);
      decoder = d;
    }
    return reasons ? d.error(value) : d.decode(value);
  }
}
