package threes.lookup;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static threes.store.SnapshotTableTest.FP_V1;
import static threes.store.SnapshotTableTest.V1;
import static threes.store.SnapshotTableTest.V2;
import static threes.store.SnapshotTableTest.airport;
import static threes.store.SnapshotTableTest.body;
import static threes.store.SnapshotTableTest.framed;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.avro.Schema;
import org.junit.jupiter.api.Test;

class EventDecoderTest {
  @Test
  void aWriterRegisteredAfterTheStartIsResolvedOnItsFirstRecord() throws Exception {
    Map<String, Schema> topic = new ConcurrentHashMap<>();
    AtomicInteger reads = new AtomicInteger();
    EventDecoder decoder = new EventDecoder(V2, fp -> {
      reads.incrementAndGet();
      return topic.get(fp);
    });
    byte[] event = framed(FP_V1, body(V1, airport(V1, "EWR", "Newark")));
    assertNull(decoder.decode(event));
    assertEquals("value has an unknown writer schema fingerprint " + FP_V1, decoder.error(event));
    // a run of records of an unknown writer reads the schema topic once per retry interval, not per record
    assertEquals(1, reads.get());
    topic.put(FP_V1, V1); // the producer registers its writer, then writes
    Thread.sleep(EventDecoder.MISS_RETRY_MS + 50);
    assertArrayEquals(body(V2, airport(V2, "EWR", "Newark")), decoder.decode(event));
    assertNull(decoder.error(event));
    assertEquals(2, reads.get());
  }

  @Test
  void nullAndUnframedValuesHaveTheirReasons() {
    EventDecoder decoder = new EventDecoder(V2, fp -> null);
    assertNull(decoder.decode(null));
    assertEquals("event has no value (null)", decoder.error(null));
    assertEquals("value is not Avro single-object encoding (no C3 01 marker)", decoder.error(new byte[] {1, 2, 3}));
  }
}
