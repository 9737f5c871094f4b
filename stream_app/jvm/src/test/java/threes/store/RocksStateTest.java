package threes.store;

import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.rocksdb.WriteBatch;

class RocksStateTest {
  static final Map<String, String> IDS = Map.of("state.airports", "AAAAAAAAAAAAAAAAAAAAAA");

  static byte[] b(String s) {
    return s.getBytes(UTF_8);
  }

  @Test
  void theLatestValuesAndTheirOffsetsSurviveAReopen(@TempDir Path dir) throws Exception {
    try (RocksState state = RocksState.open(dir, "airports", "fp1", IDS); WriteBatch batch = new WriteBatch()) {
      assertTrue(state.offsets().isEmpty());
      state.putLatest(batch, b("EWR"), b("Newark"));
      state.putLatest(batch, b("JFK"), b("Kennedy"));
      state.putLatest(batch, b("LGA"), b("LaGuardia"));
      state.putLatest(batch, b("JFK"), null); // a tombstone
      state.putOffset(batch, "state.airports", 0, 4);
      state.write(batch);
      state.checkpoint();
    }
    try (RocksState state = RocksState.open(dir, "airports", "fp1", IDS)) {
      assertFalse(state.rebuilt());
      assertEquals(Map.of("state.airports:0", 4L), state.offsets());
      assertArrayEquals(b("Newark"), state.latest(b("EWR")));
      assertNull(state.latest(b("JFK")));
      List<byte[][]> range = state.range(b("A"), b("M"), 10);
      assertEquals(2, range.size());
      assertArrayEquals(b("EWR"), range.get(0)[0]);
      assertArrayEquals(b("LGA"), range.get(1)[0]);
      assertEquals(1, state.range(null, null, 1).size());
    }
  }

  @Test
  void anotherFingerprintOrTopicIdRebuildsTheStoreEmpty(@TempDir Path dir) throws Exception {
    try (RocksState state = RocksState.open(dir, "airports", "fp1", IDS); WriteBatch batch = new WriteBatch()) {
      state.putLatest(batch, b("EWR"), b("Newark"));
      state.putOffset(batch, "state.airports", 0, 1);
      state.write(batch);
      state.checkpoint();
    }
    try (RocksState state = RocksState.open(dir, "airports", "fp2", IDS)) {
      assertTrue(state.rebuilt());
      assertTrue(state.offsets().isEmpty());
      assertNull(state.latest(b("EWR")));
    }
    try (RocksState state = RocksState.open(dir, "airports", "fp2", Map.of("state.airports", "BBBBBBBBBBBBBBBBBBBBBB"))) {
      assertTrue(state.rebuilt(), "a topic created again since is never read from the old store");
    }
  }

  @Test
  void aCorruptStoreIsRebuiltNeverRead(@TempDir Path dir) throws Exception {
    try (RocksState state = RocksState.open(dir, "airports", "fp1", IDS); WriteBatch batch = new WriteBatch()) {
      for (int i = 0; i < 2000; i++) {
        state.putLatest(batch, b("k" + i), b("v" + i));
      }
      state.putOffset(batch, "state.airports", 0, 2000);
      state.write(batch);
      state.checkpoint();
    }
    for (Path p : Files.list(dir).toList()) { // truncate every table file and the manifest
      String name = p.getFileName().toString();
      if (name.endsWith(".sst") || name.startsWith("MANIFEST")) {
        Files.write(p, new byte[] {1, 2, 3});
      }
    }
    try (RocksState state = RocksState.open(dir, "airports", "fp1", IDS)) {
      assertTrue(state.rebuilt());
      assertTrue(state.offsets().isEmpty(), "a rebuilt store reads the topics from their beginning");
      assertNull(state.latest(b("k1")));
    }
  }

  @Test
  void aSecondProcessNeverDeletesALiveStore(@TempDir Path dir) throws Exception {
    try (RocksState state = RocksState.open(dir, "airports", "fp1", IDS); WriteBatch batch = new WriteBatch()) {
      state.putLatest(batch, b("EWR"), b("Newark"));
      state.write(batch);
      assertThrows(RocksState.StoreLockedException.class, () -> RocksState.open(dir, "airports", "fp1", IDS));
      assertArrayEquals(b("Newark"), state.latest(b("EWR")));
    }
  }

  @Test
  void asOfAnswersTheVersionValidAtATimeAndTheLaterRecordWinsAtEqualTimes(@TempDir Path dir) throws Exception {
    try (RocksState state = RocksState.open(dir, "airports", "fp1", IDS); WriteBatch batch = new WriteBatch()) {
      state.putVersion(batch, b("EWR"), 100, 0, 1, b("a"));
      state.putVersion(batch, b("EWR"), 200, 0, 2, b("b"));
      state.putVersion(batch, b("EWR"), 200, 0, 3, b("c")); // same time, later offset: wins
      state.putVersion(batch, b("EWR"), 300, 0, 4, null); // deleted at 300
      state.putVersion(batch, b("EWR"), 400, 0, 5, b("d"));
      state.putVersion(batch, b("EW"), 50, 0, 6, b("other key, a prefix of EWR"));
      state.write(batch);
      assertNull(state.versionAt(b("EWR"), 99));
      assertVersion(state.versionAt(b("EWR"), 100), 100, 200, "a");
      assertVersion(state.versionAt(b("EWR"), 199), 100, 200, "a");
      assertVersion(state.versionAt(b("EWR"), 200), 200, 300, "c");
      assertNull(state.versionAt(b("EWR"), 300));
      assertNull(state.versionAt(b("EWR"), 399));
      assertVersion(state.versionAt(b("EWR"), 10_000), 400, Long.MAX_VALUE, "d");
      assertVersion(state.versionAt(b("EW"), 10_000), 50, Long.MAX_VALUE, "other key, a prefix of EWR");
      assertNull(state.versionAt(b("JFK"), 10_000));
      state.prune(b("EWR"), 350); // versions that ended by 350 go; the one valid at 350 (the tombstone) stays
      assertNull(state.versionAt(b("EWR"), 150));
      assertNull(state.versionAt(b("EWR"), 350));
      assertVersion(state.versionAt(b("EWR"), 400), 400, Long.MAX_VALUE, "d");
    }
  }

  @Test
  void asOfMatchesAnOracleOnRandomVersionsWithEqualTimes(@TempDir Path dir) throws Exception {
    Random random = new Random(7);
    Map<String, TreeMap<Long, String>> oracle = new java.util.HashMap<>();
    try (RocksState state = RocksState.open(dir, "airports", "fp1", IDS); WriteBatch batch = new WriteBatch()) {
      for (int offset = 0; offset < 20_000; offset++) {
        String key = "k" + random.nextInt(200);
        long t = random.nextInt(1000); // many equal times: the record applied last (higher offset) wins
        String value = random.nextInt(10) == 0 ? null : "v" + offset;
        state.putVersion(batch, b(key), t, 0, offset, value == null ? null : b(value));
        oracle.computeIfAbsent(key, k -> new TreeMap<>()).put(t, value);
      }
      state.write(batch);
      int wrong = 0;
      for (int q = 0; q < 20_000; q++) {
        String key = "k" + random.nextInt(210);
        long at = random.nextInt(1100) - 50;
        TreeMap<Long, String> versions = oracle.get(key);
        Map.Entry<Long, String> expected = versions == null ? null : versions.floorEntry(at);
        RocksState.Version got = state.versionAt(b(key), at);
        String want = expected == null ? null : expected.getValue();
        String have = got == null ? null : new String(got.value(), UTF_8);
        if (!java.util.Objects.equals(want, have)) {
          wrong++;
        }
      }
      assertEquals(0, wrong);
    }
  }

  static void assertVersion(RocksState.Version v, long from, long to, String value) {
    assertEquals(from, v.validFromMs());
    assertEquals(to, v.validToMs());
    assertArrayEquals(b(value), v.value());
  }
}
