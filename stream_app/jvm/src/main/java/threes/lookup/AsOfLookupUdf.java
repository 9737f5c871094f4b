package threes.lookup;

import org.apache.spark.sql.api.java.UDF2;
import threes.store.RocksState;
import threes.store.SnapshotStore;
import threes.store.StoreSpec;

/**
 * An as-of snapshot lookup as a Spark UDF: (key body, time in epoch ms) in, the value body of the key's
 * version valid at that time out (null when it had none: absent, deleted, or older than the retention).
 *
 * <p>The versioned counterpart of {@link LookupUdf}, against the same store (its {@code versions}
 * column family, KIP-889): a version is valid from its source time up to the next version's.
 */
public final class AsOfLookupUdf implements UDF2<byte[], Long, byte[]> {
  private static final long serialVersionUID = 1L;

  private final StoreSpec spec;
  private transient volatile SnapshotStore store;

  /** An as-of lookup into the store of {@code spec} (a spec with a retention). */
  public AsOfLookupUdf(StoreSpec spec) {
    this.spec = spec;
  }

  @Override
  public byte[] call(byte[] key, Long atMs) {
    if (key == null || atMs == null) {
      return null;
    }
    SnapshotStore s = store;
    if (s == null) {
      s = SnapshotStore.forSpec(spec);
      store = s;
    }
    RocksState.Version version = s.lookupAsOf(key, atMs);
    return version == null ? null : version.value();
  }
}
