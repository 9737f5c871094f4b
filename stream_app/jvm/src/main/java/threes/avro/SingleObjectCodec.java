package threes.avro;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.HexFormat;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Function;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;

/**
 * Turns the project's single-object Avro records into bare Avro bodies of one reader schema.
 *
 * <p>The wire format is the one of {@code schemas/serde.py} (the Avro specification's single-object
 * encoding): {@code C3 01}, the writer schema's 8-byte fingerprint, the Avro binary body. The writer
 * schema of a fingerprint comes from the schema topic ({@link SchemaTopic}); Avro's schema resolution
 * maps it to the reader schema (added fields take their defaults, removed ones are skipped), and the
 * result is encoded again with the reader schema. Re-encoding once, when a record enters the store,
 * makes every stored key and value a canonical body of the reader schema: a lookup compares bytes,
 * and Spark's {@code from_avro} decodes the value with the reader schema alone. A writer schema of the
 * reader's Parsing Canonical Form (the common case: the snapshot reads what its source writes) encodes
 * every value as the reader does: a codec made to {@code copyIdentical} copies such bodies as they are,
 * without decoding them (as Kafka Streams restores the bytes of its store). The state store does; the
 * events' decoder, which dead-letters a body that does not decode, does not.
 *
 * <p>Not thread-safe: each store's consumer thread owns one.
 */
public final class SingleObjectCodec {
  /** The two marker bytes of single-object encoding. */
  static final byte MARKER_0 = (byte) 0xC3;

  static final byte MARKER_1 = (byte) 0x01;

  /** Marker (2 bytes) and fingerprint (8 bytes). */
  static final int HEADER_BYTES = 10;

  private final Schema reader;
  private final Function<String, Schema> writers;
  private final Map<String, GenericDatumReader<Object>> readers = new ConcurrentHashMap<>();
  private final Map<String, Boolean> identity = new ConcurrentHashMap<>();
  private final String readerForm;
  private final boolean copyIdentical;
  private final GenericDatumWriter<Object> writer;
  private final ByteArrayOutputStream buffer = new ByteArrayOutputStream(256);
  private BinaryDecoder decoder;
  private BinaryEncoder encoder;

  /**
   * A codec to one reader schema.
   *
   * @param reader the schema every body is re-encoded with (the snapshot's key or value schema)
   * @param writers the writer schema of a fingerprint (16 lowercase hex characters), or null when
   *     unknown
   */
  public SingleObjectCodec(Schema reader, Function<String, Schema> writers) {
    this(reader, writers, false);
  }

  /**
   * A codec to one reader schema that copies the bodies of writers of the reader's form undecoded.
   *
   * @param reader the schema every body is re-encoded with
   * @param writers the writer schema of a fingerprint, or null when unknown
   * @param copyIdentical copy a body whose writer has the reader's Parsing Canonical Form, undecoded
   */
  public SingleObjectCodec(Schema reader, Function<String, Schema> writers, boolean copyIdentical) {
    this.copyIdentical = copyIdentical;
    this.reader = reader;
    this.writers = writers;
    this.writer = new GenericDatumWriter<>(reader);
    this.readerForm = SchemaNormalization.toParsingForm(reader);
  }

  /** The fingerprint of a single-object record as 16 lowercase hex characters, or null without a marker. */
  public static String fingerprintHex(byte[] data) {
    if (data == null || data.length < HEADER_BYTES || data[0] != MARKER_0 || data[1] != MARKER_1) {
      return null;
    }
    return HexFormat.of().formatHex(data, 2, HEADER_BYTES);
  }

  /**
   * The body of {@code data} in the reader schema.
   *
   * @param data a single-object record (marker, fingerprint, body)
   * @return the Avro binary body in the reader schema
   * @throws BadRecordException no marker, a fingerprint the schema topic does not hold, or a body that
   *     does not decode with its writer schema
   */
  public byte[] toReaderBody(byte[] data) throws BadRecordException {
    String fp = fingerprintHex(data);
    if (fp == null) {
      throw new BadRecordException("no single-object marker (C3 01)");
    }
    GenericDatumReader<Object> datumReader = readers.get(fp);
    if (datumReader == null) {
      Schema writerSchema = writers.apply(fp);
      if (writerSchema == null) {
        throw new BadRecordException("fingerprint " + fp + " is not in the schema topic");
      }
      datumReader = new GenericDatumReader<>(writerSchema, reader);
      readers.put(fp, datumReader);
      identity.put(fp, SchemaNormalization.toParsingForm(writerSchema).equals(readerForm));
    }
    if (copyIdentical && identity.get(fp)) {
      return java.util.Arrays.copyOfRange(data, HEADER_BYTES, data.length);
    }
    try {
      decoder = DecoderFactory.get().binaryDecoder(data, HEADER_BYTES, data.length - HEADER_BYTES, decoder);
      Object datum = datumReader.read(null, decoder);
      buffer.reset();
      encoder = EncoderFactory.get().binaryEncoder(buffer, encoder);
      writer.write(datum, encoder);
      encoder.flush();
      return buffer.toByteArray();
    } catch (IOException | RuntimeException e) {
      throw new BadRecordException("body does not decode with writer " + fp + ": " + e, e);
    }
  }

  /** A record that cannot enter the store; the consumer counts and logs it, like a dead letter. */
  public static final class BadRecordException extends Exception {
    private static final long serialVersionUID = 1L;

    BadRecordException(String message) {
      super(message);
    }

    BadRecordException(String message, Throwable cause) {
      super(message, cause);
    }
  }
}
