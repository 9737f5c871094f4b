package threes.store;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.junit.jupiter.api.Test;
import threes.avro.SingleObjectCodec;

public class SnapshotTableTest {
  public static final Schema V1 = new Schema.Parser().parse(
      "{\"type\":\"record\",\"name\":\"airport\",\"fields\":[{\"name\":\"faa\",\"type\":\"string\"},"
          + "{\"name\":\"name\",\"type\":\"string\"}]}");
  public static final Schema V2 = new Schema.Parser().parse(
      "{\"type\":\"record\",\"name\":\"airport\",\"fields\":[{\"name\":\"faa\",\"type\":\"string\"},"
          + "{\"name\":\"name\",\"type\":\"string\"},{\"name\":\"tz\",\"type\":\"int\",\"default\":-5}]}");
  public static final String FP_V1 = "0102030405060708";

  public static byte[] body(Schema schema, GenericRecord record) throws IOException {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    BinaryEncoder enc = EncoderFactory.get().binaryEncoder(out, null);
    new GenericDatumWriter<GenericRecord>(schema).write(record, enc);
    enc.flush();
    return out.toByteArray();
  }

  public static byte[] framed(String fp, byte[] body) {
    byte[] out = new byte[10 + body.length];
    out[0] = (byte) 0xC3;
    out[1] = 0x01;
    System.arraycopy(HexFormat.of().parseHex(fp), 0, out, 2, 8);
    System.arraycopy(body, 0, out, 10, body.length);
    return out;
  }

  public static GenericRecord airport(Schema schema, String faa, String name) {
    GenericRecord r = new GenericData.Record(schema);
    r.put("faa", faa);
    r.put("name", name);
    if (schema.getField("tz") != null) {
      r.put("tz", -5);
    }
    return r;
  }

  @Test
  void writerBodiesAreResolvedToTheReaderSchema() throws Exception {
    Map<String, Schema> writers = new HashMap<>(Map.of(FP_V1, V1));
    SingleObjectCodec codec = new SingleObjectCodec(V2, writers::get);
    byte[] got = codec.toReaderBody(framed(FP_V1, body(V1, airport(V1, "EWR", "Newark"))));
    // the reader's added field takes its default; the bytes are the reader's canonical body
    assertArrayEquals(body(V2, airport(V2, "EWR", "Newark")), got);
    GenericRecord decoded = new GenericDatumReader<GenericRecord>(V2).read(null,
        DecoderFactory.get().binaryDecoder(got, null));
    assertEquals(-5, decoded.get("tz"));
    assertEquals("Newark", decoded.get("name").toString());
  }

  @Test
  void badRecordsAreRefusedWithTheReason() {
    SingleObjectCodec codec = new SingleObjectCodec(V2, fp -> null);
    var noMarker = assertThrows(SingleObjectCodec.BadRecordException.class,
        () -> codec.toReaderBody(new byte[] {1, 2, 3}));
    assertTrue(noMarker.getMessage().contains("marker"));
    var unknown = assertThrows(SingleObjectCodec.BadRecordException.class,
        () -> codec.toReaderBody(framed("ffffffffffffffff", new byte[] {2, 65})));
    assertTrue(unknown.getMessage().contains("ffffffffffffffff"));
  }

  @Test
  void upsertsReplaceAndTombstonesDelete() throws Exception {
    SnapshotTable table = new SnapshotTable("airports", 1 << 20);
    byte[] key = {6, 'E', 'W', 'R'};
    table.apply(key, new byte[] {1});
    table.apply(key.clone(), new byte[] {2, 3}); // an equal key in another array: the same entry
    assertArrayEquals(new byte[] {2, 3}, table.get(key.clone()));
    assertEquals(1, table.size());
    assertEquals(key.length + 2 + SnapshotTable.ENTRY_OVERHEAD_BYTES, table.bytes());
    table.apply(key, null);
    assertNull(table.get(key));
    assertEquals(0, table.size());
    assertEquals(0, table.bytes());
    table.apply(new byte[] {9}, null); // a tombstone for a key never seen changes nothing
    assertEquals(0, table.bytes());
  }


  @Test
  void aSnapshotThatDoesNotFitIsRefusedWithTheNumbers() throws Exception {
    long max = 3 * (4 + 10 + SnapshotTable.ENTRY_OVERHEAD_BYTES);
    SnapshotTable table = new SnapshotTable("airports", max);
    for (int i = 0; i < 3; i++) {
      table.apply(new byte[] {1, 2, 3, (byte) i}, new byte[10]);
    }
    var e = assertThrows(SnapshotTable.SnapshotTooLargeException.class,
        () -> table.apply(new byte[] {1, 2, 3, 4}, new byte[10]));
    assertTrue(e.getMessage().contains("snapshot airports needs more than " + (max + 14 + 112)), e.getMessage());
    assertTrue(e.getMessage().contains("max_bytes is " + max), e.getMessage());
    assertEquals(3, table.size()); // the refused put left the table as it was
    // replacing a value with one of the same size still fits
    table.apply(new byte[] {1, 2, 3, 0}, new byte[10]);
  }
}
