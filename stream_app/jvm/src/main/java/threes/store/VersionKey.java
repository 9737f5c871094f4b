package threes.store;

import java.nio.ByteBuffer;

/**
 * The layout of a version in the store's {@code versions} column family, ordered by key then time.
 *
 * <p>Key: {@code int} length of the key body, the key body, then {@code long} valid-from (epoch ms, its
 * sign bit flipped so that byte order is numeric order), {@code int} partition and {@code long} offset
 * (the record's position: at equal times the later record sorts last, and applying a record twice writes
 * the same entry). Value: {@code 0} for a tombstone, or {@code 1} followed by the value body.
 */
final class VersionKey {
  private static final int SUFFIX = 8 + 4 + 8;

  private VersionKey() {}

  /** The entries of {@code key} all start with this. */
  static byte[] prefix(byte[] key) {
    return ByteBuffer.allocate(4 + key.length).putInt(key.length).put(key).array();
  }

  static byte[] of(byte[] key, long validFromMs, int partition, long offset) {
    return ByteBuffer.allocate(4 + key.length + SUFFIX).putInt(key.length).put(key)
        .putLong(validFromMs ^ Long.MIN_VALUE).putInt(partition ^ Integer.MIN_VALUE).putLong(offset ^ Long.MIN_VALUE)
        .array();
  }

  /** The valid-from time of an entry whose key prefix is {@code prefixLength} bytes long. */
  static long validFrom(byte[] entryKey, int prefixLength) {
    return ByteBuffer.wrap(entryKey, prefixLength, 8).getLong() ^ Long.MIN_VALUE;
  }

  static byte[] versionValue(byte[] value) {
    if (value == null) {
      return new byte[] {0};
    }
    byte[] out = new byte[value.length + 1];
    out[0] = 1;
    System.arraycopy(value, 0, out, 1, value.length);
    return out;
  }

  /** The value body of a stored version, or null for a tombstone. */
  static byte[] valueOf(byte[] stored) {
    if (stored.length == 0 || stored[0] == 0) {
      return null;
    }
    byte[] out = new byte[stored.length - 1];
    System.arraycopy(stored, 1, out, 0, out.length);
    return out;
  }

  static boolean startsWith(byte[] bytes, byte[] prefix) {
    return bytes.length >= prefix.length && java.util.Arrays.equals(bytes, 0, prefix.length, prefix, 0, prefix.length);
  }
}
