package threes.lookup;

import threes.store.SnapshotStore;
import threes.store.StoreSpec;

import org.apache.spark.sql.api.java.UDF1;

/**
 * A snapshot lookup as a Spark UDF: key body in, value body out, both bare Avro bodies.
 *
 * <p>The event side builds the key with {@code to_avro(struct(key columns), key schema)} (or the key
 * string's UTF-8 bytes for a {@code key_format: string} snapshot); the result is decoded with {@code
 * from_avro(value, value schema)}, null when the snapshot has no such key. Registered from Python with
 * {@code spark._jsparkSession.udf().register(name, new LookupUdf(spec), BinaryType)}: a JVM UDF is in
 * the operator allow-list of Spark's real-time mode, where no Python operator may run. The spec travels
 * to the executors with the plan; each executor JVM builds the store on its first lookup and blocks
 * that lookup on the readiness gate.
 */
public final class LookupUdf implements UDF1<byte[], byte[]> {
  private static final long serialVersionUID = 1L;

  private final StoreSpec spec;
  private transient volatile SnapshotStore store;

  /** A lookup into the store of {@code spec}. */
  public LookupUdf(StoreSpec spec) {
    this.spec = spec;
  }

  @Override
  public byte[] call(byte[] key) {
    if (key == null) {
      return null;
    }
    SnapshotStore s = store;
    if (s == null) {
      s = SnapshotStore.forSpec(spec);
      store = s;
    }
    return s.lookup(key);
  }
}
