package threes.store;

import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.time.Instant;
import java.time.LocalDate;
import java.util.Base64;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import org.apache.avro.LogicalType;
import org.apache.avro.LogicalTypes;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;

/**
 * Avro bodies of a snapshot as JSON, and keys given as text as Avro bodies: the terms of a query.
 *
 * <p>Values render as the job's Python queries render them: decimals as strings, timestamps ISO-8601 UTC
 * ({@code ...Z}), dates ISO-8601, bytes base64, maps as objects. A key given per key field (text) becomes
 * the key body the job's {@code to_avro} writes for the same values, so a query finds what a lookup finds.
 */
final class JsonValues {
  /** One reader per schema, shared by the query threads (Avro caches its resolution per reader). */
  private static final java.util.Map<Schema, GenericDatumReader<Object>> READERS =
      new java.util.concurrent.ConcurrentHashMap<>();

  private JsonValues() {}

  /** Append {@code s} as a JSON string. */
  static void string(StringBuilder out, CharSequence s) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }

  /** Append the value body {@code body} of {@code schema} as JSON. */
  static void body(StringBuilder out, Schema schema, byte[] body) throws IOException {
    GenericDatumReader<Object> reader = READERS.computeIfAbsent(schema, GenericDatumReader::new);
    Object datum = reader.read(null, DecoderFactory.get().binaryDecoder(body, null));
    value(out, schema, datum);
  }

  static void value(StringBuilder out, Schema schema, Object v) {
    if (v == null) {
      out.append("null");
      return;
    }
    if (schema.getType() == Schema.Type.UNION) {
      value(out, schema.getTypes().get(GenericData.get().resolveUnion(schema, v)), v);
      return;
    }
    LogicalType logical = schema.getLogicalType();
    if (logical != null && logical(out, logical, v)) {
      return;
    }
    switch (schema.getType()) {
      case RECORD -> {
        GenericRecord record = (GenericRecord) v;
        out.append('{');
        boolean first = true;
        for (Schema.Field field : schema.getFields()) {
          if (!first) {
            out.append(',');
          }
          first = false;
          string(out, field.name());
          out.append(':');
          value(out, field.schema(), record.get(field.pos()));
        }
        out.append('}');
      }
      case ARRAY -> {
        out.append('[');
        boolean first = true;
        for (Object item : (Collection<?>) v) {
          if (!first) {
            out.append(',');
          }
          first = false;
          value(out, schema.getElementType(), item);
        }
        out.append(']');
      }
      case MAP -> {
        out.append('{');
        boolean first = true;
        for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
          if (!first) {
            out.append(',');
          }
          first = false;
          string(out, String.valueOf(e.getKey()));
          out.append(':');
          value(out, schema.getValueType(), e.getValue());
        }
        out.append('}');
      }
      case BYTES -> string(out, Base64.getEncoder().encodeToString(bytes((ByteBuffer) v)));
      case FIXED -> string(out, Base64.getEncoder().encodeToString(((GenericData.Fixed) v).bytes()));
      case STRING, ENUM -> string(out, v.toString());
      case FLOAT, DOUBLE -> {
        double d = ((Number) v).doubleValue();
        if (Double.isFinite(d)) {
          out.append(v);
        } else {
          string(out, v.toString()); // NaN and infinities are no JSON numbers
        }
      }
      default -> out.append(v); // boolean, int, long
    }
  }

  private static boolean logical(StringBuilder out, LogicalType logical, Object v) {
    if (logical instanceof LogicalTypes.Decimal decimal) {
      byte[] unscaled = v instanceof ByteBuffer b ? bytes(b) : ((GenericData.Fixed) v).bytes();
      string(out, new BigDecimal(new BigInteger(unscaled), decimal.getScale()).toPlainString());
      return true;
    }
    String name = logical.getName();
    long n = v instanceof Number num ? num.longValue() : 0;
    Instant at = switch (name) {
      case "timestamp-millis", "local-timestamp-millis" -> Instant.ofEpochMilli(n);
      case "timestamp-micros", "local-timestamp-micros" ->
          Instant.ofEpochSecond(Math.floorDiv(n, 1_000_000L), Math.floorMod(n, 1_000_000L) * 1000);
      default -> null;
    };
    if (at != null) {
      string(out, at.toString());
      return true;
    }
    if ("date".equals(name)) {
      string(out, LocalDate.ofEpochDay(n).toString());
      return true;
    }
    return false;
  }

  private static byte[] bytes(ByteBuffer b) {
    ByteBuffer d = b.duplicate();
    byte[] out = new byte[d.remaining()];
    d.get(out);
    return out;
  }

  /**
   * The key body of a key given as text per field.
   *
   * @param keySchema the reader key schema (a record); null for {@code key_format: string} keys
   * @param parts field to text; a string key has one part, any name
   * @throws IllegalArgumentException a field missing, unknown or not of its type (the message says which)
   */
  static byte[] keyBody(Schema keySchema, Map<String, String> parts) throws IOException {
    if (keySchema == null) {
      if (parts.size() != 1) {
        throw new IllegalArgumentException("the key is one string");
      }
      return parts.values().iterator().next().getBytes(java.nio.charset.StandardCharsets.UTF_8);
    }
    List<Schema.Field> fields = keySchema.getFields();
    List<String> names = fields.stream().map(Schema.Field::name).toList();
    if (!parts.keySet().equals(new java.util.HashSet<>(names))) {
      throw new IllegalArgumentException("the key has fields " + names + "; given " + parts.keySet());
    }
    GenericData.Record record = new GenericData.Record(keySchema);
    for (Schema.Field field : fields) {
      record.put(field.pos(), parse(field, parts.get(field.name())));
    }
    java.io.ByteArrayOutputStream bytes = new java.io.ByteArrayOutputStream();
    BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(bytes, null);
    new GenericDatumWriter<GenericRecord>(keySchema).write(record, encoder);
    encoder.flush();
    return bytes.toByteArray();
  }

  private static Object parse(Schema.Field field, String text) {
    Schema schema = field.schema();
    if (schema.getType() == Schema.Type.UNION) {
      schema = schema.getTypes().stream().filter(s -> s.getType() != Schema.Type.NULL).findFirst().orElse(schema);
    }
    try {
      return switch (schema.getType()) {
        case STRING -> text;
        case INT -> Integer.parseInt(text);
        case LONG -> Long.parseLong(text);
        case BOOLEAN -> {
          if (!text.equals("true") && !text.equals("false")) {
            throw new NumberFormatException();
          }
          yield Boolean.parseBoolean(text);
        }
        default -> throw new IllegalArgumentException("key field '" + field.name() + "' of type " + schema.getType()
            + " cannot be queried");
      };
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException("key field '" + field.name() + "' is of type "
          + schema.getType().getName() + ", got '" + text + "'");
    }
  }
}
