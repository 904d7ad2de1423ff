package heapstate

import java.io.{File, RandomAccessFile}

import org.apache.spark.sql.execution.streaming.state.{RecordType, StateStore}
import org.apache.spark.sql.types.{LongType, StructField, StructType}
import org.scalatest.funsuite.AnyFunSuite

import heapstate.StoreFixture._
import heapstate.io.{StateFileException, StateFiles}

class HeapStateStoreProviderSuite extends AnyFunSuite {
  private val CF = StateStore.DEFAULT_COL_FAMILY_NAME

  private def files(root: String): Seq[String] =
    Option(storeDir(root).listFiles).toSeq.flatten.map(_.getName).filterNot(_.startsWith(".")).sorted
  private def snapshots(root: String): Seq[String] = files(root).filter(_.endsWith(".hs-snapshot"))
  /** The versions of the journals in `root`'s store, in order. */
  private def journalVersions(root: String): Seq[Int] =
    files(root).filter(_.endsWith(".hs-journal")).map(_.stripSuffix(".hs-journal").toInt).sorted

  /**
   * Commits versions 1 to `n` on `p`, version v + 1 putting key v % 7 = v, and calls `after`
   * after each commit; returns each version's contents, version 0's included.
   */
  private def commitModSeven(p: HeapStateStoreProvider, n: Int)(after: => Unit): Map[Long, Map[Long, Long]] = {
    val model = scala.collection.mutable.Map.empty[Long, Long]
    val byVersion = scala.collection.mutable.Map(0L -> Map.empty[Long, Long])
    for (v <- 0 until n) {
      val s = p.getStore(v, None, false, false)
      put(s, v % 7, v); model((v % 7).toLong) = v
      s.commit()
      byVersion(v + 1L) = model.toMap
      after
    }
    byVersion.toMap
  }

  /** A fresh provider of `root` reads each of `versions` equal to `byVersion`'s contents. */
  private def assertRebuilt(root: String, versions: Seq[Long], byVersion: Long => Map[Long, Long]): Unit = {
    val fresh = provider(root)
    for (v <- versions) assert(contents(fresh.getReadStore(v, None)) == byVersion(v), s"version $v")
  }

  test("put, get, remove, commit, and a fresh provider reads the committed version") {
    val root = tempDir()
    val p = provider(root)
    val s0 = p.getStore(0, None, false, false)
    put(s0, 1, 10); put(s0, 2, 20); put(s0, 3, 30); remove(s0, 2)
    assert(get(s0, 1).contains(10) && get(s0, 2).isEmpty)
    assert(s0.commit() == 1)
    val s1 = p.getStore(1, None, false, false)
    put(s1, 1, 11); remove(s1, 3); put(s1, 4, 40)
    assert(contents(s1) == Map(1L -> 11L, 4L -> 40L))
    assert(s1.commit() == 2)
    p.close()
    val fresh = provider(root)
    assert(contents(fresh.getReadStore(1, None)) == Map(1L -> 10L, 3L -> 30L))
    assert(contents(fresh.getStore(2, None, false, false)) == Map(1L -> 11L, 4L -> 40L))
    assert(files(root) == Seq("1.hs-journal", "2.hs-journal"))
  }

  test("a row get returns keeps its value through the store's next GotRows - 1 gets, live or changed") {
    val p = provider(tempDir())
    val s0 = p.getStore(0, None, false, false)
    val n = HeapStateStoreProvider.GotRows
    for (k <- 0 until n) put(s0, k, 100L + k)
    assert(s0.commit() == 1)
    val s1 = p.getStore(1, None, false, false)
    put(s1, 0, 7) // the first key is read from the batch's changes, the others from the live state
    val rows = (0 until n).map(k => s1.get(row(k), StateStore.DEFAULT_COL_FAMILY_NAME))
    assert(rows.map(_.getLong(0)) == (7L +: (1 until n).map(100L + _)))
    // Spark's stream-stream join of state format 1: read a value, read the last one into its
    // place, and return the first.
    val first = s1.get(row(1), StateStore.DEFAULT_COL_FAMILY_NAME)
    s1.put(row(1), s1.get(row(n - 1), StateStore.DEFAULT_COL_FAMILY_NAME), StateStore.DEFAULT_COL_FAMILY_NAME)
    assert(first.getLong(0) == 101L && get(s1, 1).contains(100L + n - 1))
    s1.abort()
    p.close()
  }

  test("rows get returned before a commit, held across it: as its scaladoc says") {
    val p = provider(tempDir())
    val s0 = p.getStore(0, None, false, false)
    for (k <- 0 until 4) put(s0, k, 100L + k)
    assert(s0.commit() == 1)
    val s1 = p.getStore(1, None, false, false)
    val untouched = s1.get(row(0), CF) // from the live state; the commit does not write key 0
    val rewritten = s1.get(row(1), CF) // from the live state; the commit writes key 1 in place
    put(s1, 1, 11)
    put(s1, 2, 12)
    val pending = s1.get(row(2), CF) // from the batch's changes
    assert(Seq(untouched, rewritten, pending).map(_.getLong(0)) == Seq(100L, 101L, 12L))
    assert(s1.commit() == 2)
    // After the commit: the key's newest value where the commit wrote it in place, the value as it
    // was elsewhere.
    assert(Seq(untouched, rewritten, pending).map(_.getLong(0)) == Seq(100L, 11L, 12L))
    assert(contents(p.getReadStore(2, None)) == Map(0L -> 100L, 1L -> 11L, 2L -> 12L, 3L -> 103L))
    p.close()
  }

  test("abort discards the batch, and the version can be written again") {
    val p = provider(tempDir())
    val s0 = p.getStore(0, None, false, false); put(s0, 1, 1); s0.commit()
    val s1 = p.getStore(1, None, false, false); put(s1, 1, 99); put(s1, 2, 2); s1.abort()
    assert(!s1.hasCommitted)
    intercept[IllegalStateException](put(s1, 3, 3))
    val again = p.getStore(1, None, false, false)
    assert(contents(again) == Map(1L -> 1L))
  }

  test("squashing: a key written many times costs one journal record") {
    val root = tempDir()
    val p = provider(root)
    val s = p.getStore(0, None, false, false)
    for (i <- 1 to 1000) put(s, 7, i)
    put(s, 8, 1); remove(s, 8) // created and removed in one batch: no record at all
    s.commit()
    val m = s.metrics
    assert(m.customMetrics(HeapStateStoreProvider.KeysWritten) == 1)
    assert(m.customMetrics(HeapStateStoreProvider.UpdatesSquashed) == 1001)
    assert(m.numKeys == 1)
    val one = new File(storeDir(root), "1.hs-journal").length()
    val p2 = provider(tempDir())
    val s2 = p2.getStore(0, None, false, false); put(s2, 7, 1000); s2.commit()
    val single = s2.metrics.customMetrics(HeapStateStoreProvider.JournalBytes)
    assert(one == single, s"journal of 1000 squashed puts is $one bytes, of one put $single bytes")
  }

  test("a re-run batch that commits the same version again leaves correct state") {
    val root = tempDir()
    // Snapshots only when asked for: a background snapshot of the re-run's version 2 (due with a
    // short interval) would race the check below that the old one is gone.
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "100"))
    val s0 = p.getStore(0, None, false, false); put(s0, 1, 1); s0.commit()
    val s1 = p.getStore(1, None, true, false); put(s1, 2, 2); s1.commit() // and a snapshot of version 2
    assert(files(root).contains("2.hs-snapshot"))
    // Spark retries batch 1 (version 1 -> 2) with different output this time.
    val retry = p.getStore(1, None, false, false)
    assert(contents(retry) == Map(1L -> 1L))
    put(retry, 3, 3); retry.commit()
    assert(!files(root).contains("2.hs-snapshot"), "the old lineage's snapshot of version 2 must go")
    assert(contents(p.getStore(2, None, false, false)) == Map(1L -> 1L, 3L -> 3L))
    assert(contents(provider(root).getReadStore(2, None)) == Map(1L -> 1L, 3L -> 3L))
    // The journal was replaced by heapstate's own local manager, not Spark's FileContext-based one
    // (which would leave a Hadoop .crc beside it): no hidden file, no temporary file left.
    assert(storeDir(root).list().filter(_.startsWith(".")).isEmpty, storeDir(root).list().toSeq)
    assert(p.journalsNotReplaced == 0)
  }

  test("a local journal replaced over one that has a Hadoop .crc beside it reads back as the new one") {
    // Written first through Spark's FileContext-based manager, as an earlier heapstate wrote a
    // re-run's journal: a checksummed layer puts a .crc beside each file, which Hadoop's reads check.
    val root = tempDir()
    val viaFileContext = Map(
      heapstate.io.StateFiles.FileManagerClassKey -> StoreFixture.FileContextManager,
      "spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "100"
    )
    val p = provider(root, viaFileContext)
    val s0 = p.getStore(0, None, false, false); put(s0, 1, 1); s0.commit()
    val s1 = p.getStore(1, None, false, false); put(s1, 2, 2); s1.commit()
    p.close()
    assert(storeDir(root).list().contains(".2.hs-journal.crc"), storeDir(root).list().toSeq)
    // The same batch again, through heapstate's local manager, with other output.
    val q = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "100"))
    val retry = q.getStore(1, None, false, false); put(retry, 3, 3); retry.commit()
    assert(q.journalsNotReplaced == 0)
    assert(!storeDir(root).list().contains(".2.hs-journal.crc"), "the stale .crc must go with the old file")
    assert(contents(provider(root).getReadStore(2, None)) == Map(1L -> 1L, 3L -> 3L))
    // Hadoop's FileSystem reads (Spark's FileSystem-based manager) check a .crc that is there,
    // and would fail on a stale one; its FileContext reads did not, in Hadoop 3.4.
    val viaFileSystem = viaFileContext + (heapstate.io.StateFiles.FileManagerClassKey -> StoreFixture.FileSystemManager)
    assert(contents(provider(root, viaFileSystem).getReadStore(2, None)) == Map(1L -> 1L, 3L -> 3L))
  }

  test("a version committed again through a manager that keeps the earlier file is counted and warned of") {
    // Spark's FileSystem-based manager: on the local disk (a checksummed file system), as on others
    // whose rename does not replace a file, it keeps the earlier file of a name and reports nothing.
    val keeps = Map(
      heapstate.io.StateFiles.FileManagerClassKey ->
        StoreFixture.FileSystemManager,
      "spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "100"
    )
    val root = tempDir()
    val p = provider(root, keeps)
    val s0 = p.getStore(0, None, false, false); put(s0, 1, 1); s0.commit()
    val s1 = p.getStore(1, None, false, false); put(s1, 2, 2); s1.commit()
    // The same batch again with the same output: the file written is the earlier one, byte for byte.
    val same = p.getStore(1, None, false, false); put(same, 2, 2); same.commit()
    assert(p.journalsNotReplaced == 0)
    // Other output this time: the manager keeps the earlier journal of version 2, and the store
    // says so. (What the files hold is then the earlier attempt's state, as with Spark's providers.)
    val retry = p.getStore(1, None, false, false); put(retry, 3, 3); retry.commit()
    assert(p.journalsNotReplaced == 1)
    assert(contents(p.getStore(2, None, false, false)) == Map(1L -> 1L, 3L -> 3L))
    assert(contents(provider(root, keeps).getReadStore(2, None)) == Map(1L -> 1L, 2L -> 2L))
    // A manager that replaces files (Spark's FileContext-based one, its default) lets the re-run in.
    val replaces = keeps + (heapstate.io.StateFiles.FileManagerClassKey ->
      StoreFixture.FileContextManager)
    val q = provider(root, replaces)
    val again = q.getStore(1, None, false, false); put(again, 3, 3); again.commit()
    assert(q.journalsNotReplaced == 0)
    assert(contents(provider(root, replaces).getReadStore(2, None)) == Map(1L -> 1L, 3L -> 3L))
  }

  test("older retained versions are served after undo runs out, from snapshot and journals") {
    val root = tempDir()
    val p = provider(root,
      Map(
        "spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "3",
        "spark.sql.streaming.stateStore.heapstate.undoVersions" -> "1"))
    for (v <- 0 until 10) {
      val s = p.getStore(v, None, false, false); put(s, v, v * 10); s.commit()
      p.doMaintenance()
    }
    for (v <- Seq(10, 4, 9, 0, 7, 10)) {
      assert(contents(p.getStore(v, None, false, false)) == (0 until v).map(i => i.toLong -> i * 10L).toMap,
        s"version $v")
    }
  }

  test("snapshots every compactionInterval versions, and cleanup keeps what minBatchesToRetain needs") {
    val root = tempDir()
    val p =
      provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "4"), minVersionsToRetain = 3)
    for (v <- 0 until 14) {
      val s = p.getStore(v, None, false, false); put(s, v % 5, v); s.commit()
      p.doMaintenance()
    }
    // Snapshots at 4, 8, 12; the newest 3 versions (12..14) need snapshot 12 and journals 13, 14.
    assert(files(root) == Seq("12.hs-snapshot", "13.hs-journal", "14.hs-journal"))
    val fresh = provider(root)
    for (v <- 12 to 14) assert(fresh.getReadStore(v, None).iterator(CF).size == 5)
    val e = intercept[StateFileException](fresh.getReadStore(11, None))
    assert(e.getMessage.contains("11.hs-journal") || e.getMessage.contains("version 1"), e.getMessage)
  }

  test("with minBatchesToRetain 1, cleanup keeps what a re-run of the last batch starts from") {
    val root = tempDir()
    val every4 = Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "4")
    val p = provider(root, every4, minVersionsToRetain = 1)
    val byVersion = commitModSeven(p, 12)(p.doMaintenance())
    // The last maintenance wrote a snapshot of the live version, 12; cleanup took snapshot 8 as
    // its base, not 12 (which would have left version 11, and 12 once its snapshot went, nothing).
    assert(files(root) == Seq("10.hs-journal", "11.hs-journal", "12.hs-journal", "12.hs-snapshot",
      "8.hs-snapshot", "9.hs-journal"))
    p.close()
    // The last batch runs again, on another executor: version 11, then a different version 12.
    val again = provider(root, every4, minVersionsToRetain = 1)
    val s = again.getStore(11, None, false, false)
    assert(contents(s) == byVersion(11L))
    put(s, 3, 300); assert(s.commit() == 12)
    again.doMaintenance()
    again.close()
    assertRebuilt(root, Seq(12L), Map(12L -> (byVersion(11L) + (3L -> 300L))))
  }

  test("a commit that fails while changing the live table leaves none of it in memory") {
    val root = tempDir()
    val p = provider(root)
    val byVersion = commitModSeven(p, 3)(())
    val live = p.liveAt(3)
    live.failAfterChanges = () => throw new IllegalStateException("injected failure")
    val s = p.getStore(3, None, false, false)
    put(s, 0, 999); put(s, 9, 90); remove(s, 1)
    assert(intercept[IllegalStateException](s.commit()).getMessage == "injected failure")
    s.abort()
    live.failAfterChanges = null
    // The retry (as a task retried on this executor asks) gets version 3 as committed, rebuilt
    // from files, and its commit of version 4 replaces the failed one's journal.
    val retry = p.getStore(3, None, false, false)
    assert(contents(retry) == byVersion(3L))
    put(retry, 5, 50); assert(retry.commit() == 4)
    assert(contents(p.getReadStore(4, None)) == byVersion(3L) + (5L -> 50L))
    p.close()
    assertRebuilt(root, Seq(3L, 4L), Map(3L -> byVersion(3L), 4L -> (byVersion(3L) + (5L -> 50L))))
  }

  test("loadEmpty and column families are refused, naming the state store") {
    val root = tempDir()
    val p = provider(root)
    val s = p.getStore(0, None, false, false); put(s, 1, 10); s.commit()
    val e = intercept[UnsupportedOperationException](p.getStore(1, None, false, true))
    val named = Seq("loadEmpty", "version 1", "partitionId=0")
    assert(named.forall(e.getMessage.contains), e.getMessage)
    assert(contents(p.getStore(1, None, false, false)) == Map(1L -> 10L))
    val cf = new HeapStateStoreProvider
    val e2 = intercept[UnsupportedOperationException] {
      cf.init(
        org.apache.spark.sql.execution.streaming.state.StateStoreId(root, 0, 1),
        keySchema,
        valueSchema,
        org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec(keySchema),
        true,
        storeConf(),
        new org.apache.hadoop.conf.Configuration(),
        false,
        None
      )
    }
    assert(e2.getMessage.contains("column families") && e2.getMessage.contains("partitionId=1"), e2.getMessage)
  }

  test("cleanup deletes the snapshots between the retained base and the newest one below the live version") {
    val root = tempDir()
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "3"),
      minVersionsToRetain = 100)
    val model = scala.collection.mutable.Map.empty[Long, Long]
    val byVersion = scala.collection.mutable.Map(0L -> Map.empty[Long, Long])
    for (v <- 0 until 12) {
      val s = p.getStore(v, None, false, false)
      put(s, v % 5, v); model((v % 5).toLong) = v
      if (v % 4 == 3) { remove(s, (v + 1) % 5); model.remove(((v + 1) % 5).toLong) }
      s.commit()
      byVersion(v + 1L) = model.toMap
      p.doMaintenance()
    }
    // Snapshots of versions 3, 6, 9 and 12. The one of 12 is at the live version, so 9 stays as
    // well (a re-run of the last batch rebuilds 11 from it); 3 and 6 go, and every journal stays.
    assert(snapshots(root) == Seq("12.hs-snapshot", "9.hs-snapshot"))
    assert((1 to 12).forall(v => files(root).contains(s"$v.hs-journal")), files(root))
    val s = p.getStore(12, None, false, false); put(s, 7, 70); model(7L) = 70; s.commit()
    byVersion(13L) = model.toMap
    p.doMaintenance()
    assert(snapshots(root) == Seq("12.hs-snapshot"))
    p.close()
    // Every version is still rebuilt exactly, from version 0's empty state and the journals.
    assertRebuilt(root, 0L to 13L, byVersion)
  }

  test("thinned snapshots keep the base advancing: journals stay within the retained versions plus the gap") {
    val root = tempDir()
    // Retain 8 versions, a snapshot every 2: the gap between kept snapshots is 8 / 2 = 4 versions,
    // so a store keeps at most 8 - 1 + 4 = 11 journals.
    val p =
      provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "2"), minVersionsToRetain = 8)
    var mostJournals = 0
    val byVersion = commitModSeven(p, 40) {
      p.doMaintenance()
      mostJournals = math.max(mostJournals, journalVersions(root).size)
    }
    assert(mostJournals <= 11, s"$mostJournals journals at most: ${files(root)}")
    // At version 40 the oldest retained version is 33: base 32, then 36 (the farthest within 4 of
    // it), 38 (a restart's start) and 40; 34 is gone, and journals 33 to 40 stay.
    assert(snapshots(root) == Seq("32.hs-snapshot", "36.hs-snapshot", "38.hs-snapshot", "40.hs-snapshot"))
    assert(journalVersions(root).size == 8, files(root))
    p.close()
    assertRebuilt(root, 33L to 40L, byVersion)
  }

  test("one cleanup after many snapshots keeps the farthest snapshot within the gap at each step") {
    val root = tempDir()
    // Retain 16 versions, a snapshot every 2: the gap is 16 / 2 = 8 versions. Cleanup runs once,
    // at version 30: snapshots no cleanup thinned yet, as a store that never cleaned up after its
    // own snapshots left them (an older heapstate, with Spark's maintenance every minute).
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "2"),
      minVersionsToRetain = 16)
    p.cleanupAfterSnapshots = false
    val byVersion = commitModSeven(p, 30)(p.doSnapshotMaintenance())
    assert(snapshots(root) == (2 to 30 by 2).map(v => s"$v.hs-snapshot").sortBy(identity))
    p.doCleanupMaintenance()
    // The oldest retained version is 15: base 14; the restart's snapshot is 28. From 14, the
    // farthest within 8 is 22, and 28 is within 8 of 22: 16, 18, 20, 24 and 26 go.
    assert(snapshots(root) == Seq("14.hs-snapshot", "22.hs-snapshot", "28.hs-snapshot", "30.hs-snapshot"))
    assert(journalVersions(root) == (15 to 30), files(root))
    p.close()
    assertRebuilt(root, 15L to 30L, byVersion)
  }

  test("cleanup deletes no snapshot above the base while files above the live version exist") {
    val root = tempDir()
    val every3 = Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "3")
    val behind = provider(root, every3, minVersionsToRetain = 100)
    behind.cleanupAfterSnapshots = false // its only cleanup is the one below
    commitModSeven(behind, 7)(behind.doSnapshotMaintenance()) // keys 0 to 6 = their version - 1
    assert(snapshots(root) == Seq("3.hs-snapshot", "6.hs-snapshot"))
    // Another instance of the store (a task moved to another executor) goes on to version 9.
    // Its commit of version 9 makes a snapshot due, which it writes in the background: wait for
    // it, so that what follows does not depend on which thread is faster.
    val ahead = provider(root, every3, minVersionsToRetain = 100)
    for (v <- 7 until 9) { val s = ahead.getStore(v, None, false, false); put(s, v, v); s.commit() }
    ahead.awaitBackground()
    behind.doCleanupMaintenance()
    assert(
      snapshots(root) == Seq("3.hs-snapshot", "6.hs-snapshot", "9.hs-snapshot"),
      "the instance at version 7 is behind: it keeps its own snapshots and the one above it"
    )
    ahead.doMaintenance() // 6 is the one below the live version, 3 goes
    assert(snapshots(root) == Seq("6.hs-snapshot", "9.hs-snapshot"))
    assert(contents(provider(root).getReadStore(9, None)) == (0L until 9L).map(k => k -> k).toMap)
  }

  test("cleanup keeps the snapshot a rebuild used in place of a damaged newer one") {
    val root = tempDir()
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "3"),
      minVersionsToRetain = 100)
    p.cleanupAfterSnapshots = false // every snapshot stays until the damage
    for (v <- 0 until 9) {
      val s = p.getStore(v, None, false, false); put(s, v, v); s.commit(); p.doSnapshotMaintenance()
    }
    p.close()
    assert(snapshots(root) == Seq("3.hs-snapshot", "6.hs-snapshot", "9.hs-snapshot"))
    val raf = new RandomAccessFile(new File(storeDir(root), "9.hs-snapshot"), "rw")
    raf.seek(raf.length() / 2); val b = raf.read(); raf.seek(raf.length() / 2); raf.write(b ^ 0xff); raf.close()
    // No snapshot falls due in this instance: the one it rebuilt from (6) is the newest it trusts.
    val fresh = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "100"),
      minVersionsToRetain = 100)
    val s = fresh.getStore(9, None, false, false); put(s, 9, 9); s.commit()
    fresh.doMaintenance()
    assert(snapshots(root) == Seq("6.hs-snapshot", "9.hs-snapshot"), "6 stays: 9 is damaged")
    assert(contents(fresh.getReadStore(10, None)) == (0L until 10L).map(k => k -> k).toMap)
  }

  test("commits clean up after the store's own snapshots, without maintenance") {
    val root = tempDir()
    // Spark's defaults as in W1: 100 versions retained, a snapshot every 10 versions (here 3).
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "3"),
      minVersionsToRetain = 100)
    val seen = scala.collection.mutable.ArrayBuffer.empty[Seq[String]]
    val byVersion = commitModSeven(p, 31) { p.awaitBackground(); seen += snapshots(root) }
    // Versions 1 to 31 (seen(v - 1) after version v): a snapshot at every third version, written in
    // the background after that commit; the next commit, with it below the live version, hands a
    // cleanup to the same thread, which deletes the one before it. Every version is retained and
    // the journals reach version 0, so no snapshot below the restart's is needed.
    for (v <- 1 to 31) {
      val newest = v / 3 * 3
      val expected = if (newest == 0) Nil else if (v == newest && v > 3) Seq(newest - 3, newest) else Seq(newest)
      assert(seen(v - 1) == expected.map(n => s"$n.hs-snapshot").sortBy(identity), s"after version $v")
    }
    assert(journalVersions(root) == (1 to 31), files(root))
    p.close()
    assertRebuilt(root, 0L to 31L, byVersion)
  }

  test("cleanups after each snapshot keep a chain within the gap, and the journals within the bound") {
    val root = tempDir()
    // Retain 16 versions, a snapshot every 2: the gap is 16 / 2 = 8 versions, and a store keeps at
    // most 16 - 1 + 8 = 23 journals. No maintenance: only the cleanups commits hand over.
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "2"),
      minVersionsToRetain = 16)
    var version = 0
    var mostJournals = 0
    val byVersion = commitModSeven(p, 60) {
      p.awaitBackground()
      version += 1
      val kept = snapshots(root).map(_.stripSuffix(".hs-snapshot").toInt).sorted
      val journals = journalVersions(root)
      mostJournals = math.max(mostJournals, journals.size)
      // Every version retained is rebuilt from the empty version 0 or a snapshot kept at or below
      // the oldest of them, and the journals above it, all kept.
      val from = journals.head - 1
      assert(journals == (from + 1 to version), s"after version $version: journals $journals")
      assert(from <= math.max(version - 16 + 1, 0) && (from == 0 || kept.contains(from)),
        s"after version $version: journals from ${from + 1}, snapshots $kept")
      // The chain: no two kept snapshots (nor the base and the first) further apart than the gap.
      val chain = (from +: kept.filter(_ > from)).distinct
      assert(chain.zip(chain.drop(1)).forall { case (a, b) => b - a <= 8 }, s"after version $version: $kept")
    }
    assert(mostJournals <= 23, s"$mostJournals journals at most")
    p.close()
    assertRebuilt(root, 45L to 60L, byVersion)
  }

  test("cleanup never takes a snapshot a rebuild found damaged as the base") {
    val root = tempDir()
    val every3 = Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "3")
    val p = provider(root, every3, minVersionsToRetain = 3)
    p.cleanupAfterSnapshots = false
    val byVersion = commitModSeven(p, 7)(p.doSnapshotMaintenance())
    p.close()
    assert(snapshots(root) == Seq("3.hs-snapshot", "6.hs-snapshot"))
    val raf = new RandomAccessFile(new File(storeDir(root), "6.hs-snapshot"), "rw")
    raf.seek(raf.length() / 2); val b = raf.read(); raf.seek(raf.length() / 2); raf.write(b ^ 0xff); raf.close()
    // The rebuild of version 7 skips snapshot 6 and starts from 3. At version 9 the oldest of the
    // three retained versions is 7: the newest snapshot at or below it is 6, damaged, so the base
    // is 3, with journals 4 to 9 (with 6 as the base, 3 and journals 4 to 6 would go).
    val fresh = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "100"),
      minVersionsToRetain = 3)
    val more = scala.collection.mutable.Map(byVersion(7).toSeq: _*)
    for (v <- 7 until 9) {
      val s = fresh.getStore(v, None, false, false); put(s, v % 7, v); s.commit(); more((v % 7).toLong) = v
    }
    fresh.doMaintenance()
    assert(journalVersions(root) == (4 to 9), files(root))
    assert(snapshots(root).contains("3.hs-snapshot"), files(root))
    fresh.close()
    assertRebuilt(root, 7L to 9L, byVersion ++ Map(9L -> more.toMap, 8L -> (byVersion(7) + (0L -> 7L))))
  }

  test("a commit that makes a snapshot due starts it in the background, without maintenance") {
    val root = tempDir()
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "3"))
    val model = scala.collection.mutable.Map.empty[Long, Long]
    def batch(v: Int): Unit = {
      val s = p.getStore(v, None, false, false)
      for (k <- 0 until 200) { put(s, (k * 7 + v) % 300, v * 1000 + k); model((k * 7 + v) % 300) = v * 1000 + k }
      remove(s, v); model.remove(v.toLong)
      s.commit()
    }
    (0 until 2).foreach(batch)
    Thread.sleep(300)
    assert(!files(root).exists(_.endsWith(".hs-snapshot")), files(root))
    batch(2) // version 3: due
    val deadline = System.nanoTime() + 30L * 1000 * 1000 * 1000
    while (!files(root).contains("3.hs-snapshot") && System.nanoTime() < deadline) Thread.sleep(20)
    assert(snapshots(root) == Seq("3.hs-snapshot"))
    // Commits go on while it is written; the snapshot holds version 3 exactly.
    val atThree = model.toMap
    (3 until 5).foreach(batch)
    p.close()
    (1 to 3).foreach(v => new File(storeDir(root), s"$v.hs-journal").delete())
    val fresh = provider(root)
    assert(contents(fresh.getReadStore(3, None)) == atThree)
    assert(contents(fresh.getReadStore(5, None)) == model.toMap)
  }

  test("a roll-back while a paced snapshot runs abandons it: no file, no temporary file, state intact") {
    val root = tempDir()
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "2"))
    val model = scala.collection.mutable.Map.empty[Long, Long]
    val s0 = p.getStore(0, None, false, false)
    for (k <- 0L until 400000L) { put(s0, k, k); model(k) = k } // ~25 MB of entries: a paced snapshot takes a while
    s0.commit() // a bulk load: its snapshot is written with it
    assert(snapshots(root) == Seq("1.hs-snapshot"))
    val s1 = p.getStore(1, None, false, false); put(s1, 1, -1);
    s1.commit() // version 2, of the store's phase (0): snapshot due, in the background
    val deadline = System.nanoTime() + 30L * 1000 * 1000 * 1000
    def tmpFiles = Option(storeDir(root).listFiles).toSeq.flatten.map(_.getName).filter(_.endsWith(".tmp"))
    while (tmpFiles.isEmpty && !files(root).contains("2.hs-snapshot") && System.nanoTime() < deadline) Thread.sleep(1)
    assert(tmpFiles.nonEmpty, s"the snapshot was not seen running: ${files(root)}")
    val back = p.getStore(1, None, false, false) // a task retry: rolls back to version 1
    assert(contents(back) == model.toMap)
    // The snapshot gave up instead of finishing while the roll-back waited.
    assert(!files(root).contains("2.hs-snapshot") && tmpFiles.isEmpty, files(root) ++ tmpFiles)
    put(back, 2, -2); back.commit()
    model(2) = -2
    p.close()
    assert(contents(provider(root).getReadStore(2, None)) == model.toMap)
  }

  test("prefix scan sees live keys and this batch's changes") {
    val p = provider(tempDir(), prefixScan = true)
    def put2(s: StateStore, g: String, t: Long, v: Long) = s.put(prefixKey(g, t), row(v), CF)
    def scan(s: StateStore, g: String) =
      s.prefixScan(prefix(g), CF).map(pr =>
        (pr.key.getUTF8String(0).toString, pr.key.getLong(1), pr.value.getLong(0))).toSet
    val s0 = p.getStore(0, None, false, false)
    put2(s0, "a", 1, 1); put2(s0, "a", 2, 2); put2(s0, "b", 1, 3); put2(s0, "ab", 1, 4)
    assert(scan(s0, "a") == Set(("a", 1L, 1L), ("a", 2L, 2L)))
    s0.commit()
    val s1 = p.getStore(1, None, false, false)
    s1.remove(prefixKey("a", 1), CF); put2(s1, "a", 3, 5); put2(s1, "a", 2, 6)
    assert(scan(s1, "a") == Set(("a", 2L, 6L), ("a", 3L, 5L)))
    assert(scan(s1, "b") == Set(("b", 1L, 3L)))
    assert(scan(s1, "zzz").isEmpty)
    s1.commit()
    val s2 = p.getStore(2, None, false, false)
    assert(scan(s2, "a") == Set(("a", 2L, 6L), ("a", 3L, 5L)))
    // Rolled back to version 1 through undo, the index follows.
    assert(scan(p.getStore(1, None, false, false), "a") == Set(("a", 1L, 1L), ("a", 2L, 2L)))
  }

  test("iterator tolerates removes while iterating, as watermark eviction does") {
    val p = provider(tempDir())
    val s0 = p.getStore(0, None, false, false); (1 to 100).foreach(i => put(s0, i, i)); s0.commit()
    val s1 = p.getStore(1, None, false, false)
    put(s1, 101, 101)
    val it = s1.iterator(CF)
    var seen = 0
    while (it.hasNext) { val pair = it.next(); seen += 1; if (pair.key.getLong(0) % 2 == 0) s1.remove(pair.key, CF) }
    assert(seen == 101)
    s1.commit()
    assert(contents(p.getStore(2, None, false, false)).keySet == (1 to 101 by 2).map(_.toLong).toSet)
  }

  test("metrics: numKeys and memoryUsedBytes are honest") {
    val p = provider(tempDir())
    val s = p.getStore(0, None, false, false)
    (1 to 1000).foreach(i => put(s, i, i))
    assert(s.metrics.numKeys == 1000)
    assert(s.metrics.customMetrics(HeapStateStoreProvider.CommitStoreTime) == 0, "no commit yet")
    val started = System.nanoTime()
    s.commit()
    val wallMicros = (System.nanoTime() - started) / 1000
    val m = s.metrics
    // The commit's time, split into the store's work and the coordinator report, within its wall time.
    val (stored, reported) =
      (m.customMetrics(HeapStateStoreProvider.CommitStoreTime),
        m.customMetrics(HeapStateStoreProvider.CommitReportTime))
    assert(stored > 0 && reported >= 0 && stored + reported <= wallMicros, (stored, reported, wallMicros))
    // Of the store's part, the time its thread ran: some, and no more than the part's wall time
    // (the two clocks differ in granularity, by well under a millisecond).
    val cpu = m.customMetrics(HeapStateStoreProvider.CommitStoreCpuTime)
    assert(cpu > 0 && cpu <= stored + 1000, (cpu, stored))
    // And the time it waited for a core: none of what it ran, and read inside the same interval,
    // so with it a part of the wall time (the same allowance for the clocks' granularity).
    val queued = m.customMetrics(HeapStateStoreProvider.CommitStoreRunQueueTime)
    assert(queued >= 0 && queued + cpu <= stored + 1000, (queued, cpu, stored))
    assert(m.numKeys == 1000)
    // 1000 keys of 16 + 16 bytes of row data; the estimate includes per-entry overhead.
    assert(m.memoryUsedBytes >= 1000L * 32 && m.memoryUsedBytes <= 1000L * 200, m.memoryUsedBytes)
    assert(HeapStateStoreProvider.CustomMetrics.forall(m.customMetrics.contains))
  }

  test("a schedstat line's second figure is the time on a run queue; a line without one reads as -1") {
    def of(line: String): Long = { val b = line.getBytes("US-ASCII"); engine.ThreadClocks.runQueueOf(b, b.length) }
    assert(of("369117830 819954 46\n") == 819954L)
    assert(of("0 0 1") == 0L)
    assert(of("12 98765432101 3") == 98765432101L)
    Seq("", "123", "123 ", " 5 6", "x 5 6", "123 x 4").foreach(l => assert(of(l) == -1L, l))
  }

  /**
   * Why the run-queue tests cannot run here, if they cannot: no readable per-thread schedstat (not
   * Linux), or a kernel that keeps no figures in it ("0 0 0" for a thread that has run).
   */
  private def noSchedStat: Option[String] = {
    val path = java.nio.file.Paths.get("/proc/thread-self/schedstat")
    if (engine.ThreadClocks.runQueueNanos() < 0) Some("Linux's per-thread schedstat is not readable here")
    else {
      val line = new String(java.nio.file.Files.readAllBytes(path), "US-ASCII")
      if (line.trim.split(' ').headOption.exists(_ != "0")) None
      else Some(s"this kernel keeps no scheduler figures per thread: $line")
    }
  }

  test("a thread's wait for a core is read from Linux's schedstat, and grows while more threads run than cores") {
    noSchedStat.foreach(why => assume(false, why))
    val before = engine.ThreadClocks.runQueueNanos()
    // Twice as many spinning threads as processors, this one among them: each waits about half the time.
    val cores = Runtime.getRuntime.availableProcessors
    val until = System.nanoTime() + 300L * 1000 * 1000
    def spin(): Long = { var n = 0L; while (System.nanoTime() < until) n += 1; n }
    val others = (1 until 2 * cores).map(_ => new Thread(() => { spin(); () }))
    others.foreach(_.start())
    spin()
    others.foreach(_.join())
    val waited = engine.ThreadClocks.runQueueNanos() - before
    assert(waited > 20L * 1000 * 1000, s"waited $waited ns for a core in 300 ms among ${2 * cores} spinning threads")
  }

  test("a commit made while more threads run than cores reports its wait for a core") {
    noSchedStat.foreach(why => assume(false, why))
    val p = provider(tempDir())
    @volatile var stop = false
    val spinners = (1 to 2 * Runtime.getRuntime.availableProcessors).map(_ => new Thread(() => { while (!stop) {} }))
    spinners.foreach(_.start())
    val queued =
      try (0 until 20).map { v =>
          val s = p.getStore(v, None, false, false)
          (1 to 2000).foreach(i => put(s, v * 2000L + i, i))
          s.commit()
          s.metrics.customMetrics(HeapStateStoreProvider.CommitStoreRunQueueTime)
        }
      finally { stop = true; spinners.foreach(_.join()) }
    // Each commit shares the cores with twice as many spinning threads: some of its time is spent waiting.
    assert(queued.forall(_ >= 0) && queued.sum > 0, queued)
  }

  test("every heapstate key is validated in init, naming the key and the allowed values") {
    val cases = Seq(
      "compactionInterval" -> "0",
      "compactionInterval" -> "-3",
      "compactionInterval" -> "ten",
      "compactionInterval" -> "",
      "compactionInterval" -> "2.5",
      "compactionInterval" -> "99999999999",
      "compressionCodec" -> "brotli",
      "compressionCodec" -> "",
      "compressionCodec" -> "-1",
      "undoVersions" -> "-1",
      "undoVersions" -> "1.5",
      "undoVersions" -> "two",
      "undoVersions" -> "",
      "undoVersions" -> "99999999999",
      "bulkLoadSnapshotBytes" -> "-1",
      "bulkLoadSnapshotBytes" -> "4MiB",
      "bulkLoadSnapshotBytes" -> "99999999999",
      "localCopyDir" -> "relative/dir",
      "localCopyDir" -> "/tmp/a,,/tmp/b",
      "localCopyDir" -> "/tmp/a,",
      "localCopyDir" -> ",",
      "localCopyDir" -> "None"
    )
    // An existing checkpoint, written with valid confs: a rejected conf must leave it as it is.
    val existing = tempDir()
    val good = provider(existing)
    for (v <- 0 until 3) { val s = good.getStore(v, None, false, false); put(s, v, v); s.commit() }
    good.close()
    def snapshotOf(root: String): Seq[(String, Long, Long)] =
      Option(storeDir(root).listFiles()).toSeq.flatten.map(f => (f.getName, f.length(), f.lastModified())).sorted
    val before = snapshotOf(existing)
    for ((name, value) <- cases; root <- Seq(tempDir(), existing)) {
      val key = s"spark.sql.streaming.stateStore.heapstate.$name"
      val e = intercept[IllegalArgumentException](provider(root, Map(key -> value)))
      assert(e.getMessage.contains(key) && e.getMessage.contains(s"'$value'") && e.getMessage.contains("expected"),
        e.getMessage)
      if (root == existing) assert(snapshotOf(root) == before, s"$key=$value touched the checkpoint")
      else assert(!new File(root).listFiles().exists(_ => true), s"$key=$value touched the checkpoint")
    }
    assert(contents(provider(existing).getReadStore(3, None)) == Map(0L -> 0L, 1L -> 1L, 2L -> 2L))
    val e = intercept[IllegalArgumentException](
      provider(tempDir(), Map("spark.sql.streaming.stateStore.heapstate.compactionIntervall" -> "5")))
    assert(e.getMessage.contains("compactionIntervall") && e.getMessage.contains("heapstate.compactionInterval"))
  }

  test("a row read from files that no longer fits the query's schema fails Spark's row check, naming the store") {
    // The query now says each value is two longs; the stored values are one (16 bytes, not 24).
    val twoLongs = StructType(Seq(StructField("v", LongType), StructField("w", LongType)))
    val root = tempDir()
    // Rows this JVM wrote are not checked, as on HDFS: this provider reads back what it wrote.
    val p = provider(root, values = twoLongs)
    val s0 = p.getStore(0, None, false, false)
    put(s0, 1, 10); put(s0, 2, 20)
    s0.commit()
    assert(p.getStore(1, None, false, false).get(row(1), CF).getSizeInBytes == 16)
    p.close()
    // Rebuilt from files, the first row a store reads from the live state is checked.
    def rowCheckFails(store: StateStore)(read: StateStore => Any): Unit = {
      val e = intercept[org.apache.spark.SparkThrowable](read(store))
      assert(e.getCondition.contains("STATE_STORE_VALUE_ROW_FORMAT_VALIDATION_FAILURE"), e)
      assert(e.asInstanceOf[Throwable].getMessage.contains(store.id.toString), e)
    }
    rowCheckFails(provider(root, values = twoLongs).getStore(1, None, false, false))(_.get(row(1), CF))
    rowCheckFails(provider(root, values = twoLongs).getStore(1, None, false, false))(_.iterator(CF).next())
    // A key the store misses and a row the batch put itself are not checked; the next live row is.
    val s1 = provider(root, values = twoLongs).getStore(1, None, false, false)
    assert(s1.get(row(3), CF) == null)
    s1.put(row(3), StoreFixture.row(30), CF)
    assert(s1.get(row(3), CF).getSizeInBytes == 16)
    rowCheckFails(s1)(_.get(row(1), CF))
    // Off, as Spark's conf allows: the rows are served as stored.
    val unchecked =
      provider(root, Map("spark.sql.streaming.stateStore.formatValidation.enabled" -> "false"), values = twoLongs)
    assert(unchecked.getStore(1, None, false, false).get(row(1), CF).getSizeInBytes == 16)
    // The schema they were written with passes, and one check covers a rebuild: the next store of
    // the same provider does not check again.
    val right = provider(root)
    assert(get(right.getStore(1, None, false, false), 1).contains(10))
    assert(get(right.getStore(1, None, false, false), 2).contains(20))
    // A prefix scan's live rows are checked the same way; a key of this batch's own is not.
    val prefixed = tempDir()
    val w = provider(prefixed, prefixScan = true)
    val pw = w.getStore(0, None, false, false)
    pw.put(prefixKey("a", 1), row(1), CF); pw.put(prefixKey("b", 1), row(2), CF)
    pw.commit()
    w.close()
    val ps = provider(prefixed, prefixScan = true, values = twoLongs).getStore(1, None, false, false)
    ps.put(prefixKey("b", 2), row(3), CF)
    assert(ps.prefixScan(prefix("b"), CF).next().value.getSizeInBytes == 16)
    rowCheckFails(ps)(_.prefixScan(prefix("a"), CF).next())
    assert(provider(prefixed, prefixScan = true).getStore(1, None, false, false).prefixScan(prefix("a"), CF)
      .map(pr => pr.key.getLong(1) -> pr.value.getLong(0)).toList == List(1L -> 1L))
  }

  test("a missing journal is an error naming the file and version") {
    val root = tempDir()
    val p = provider(root)
    for (v <- 0 until 3) { val s = p.getStore(v, None, false, false); put(s, v, v); s.commit() }
    new File(storeDir(root), "2.hs-journal").delete()
    val e = intercept[StateFileException](provider(root).getReadStore(3, None))
    assert(e.getMessage.contains("2.hs-journal") && e.getMessage.contains("version 2"), e.getMessage)
    intercept[StateFileException](provider(root).getReadStore(7, None))
  }

  test("a damaged snapshot falls back to an older one with journals; a damaged journal fails") {
    val root = tempDir()
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "2"),
      minVersionsToRetain = 100)
    for (v <- 0 until 6) { val s = p.getStore(v, None, false, false); put(s, v, v); s.commit(); p.doMaintenance() }
    val expected = (0 until 6).map(i => i.toLong -> i.toLong).toMap
    val snap = new File(storeDir(root), "6.hs-snapshot")
    assert(snap.exists())
    val raf = new RandomAccessFile(snap, "rw"); raf.seek(30); raf.write(0xab ^ raf.read()); raf.close()
    assert(contents(provider(root).getReadStore(6, None)) == expected)
    val journal = new File(storeDir(root), "6.hs-journal")
    val raf2 = new RandomAccessFile(journal, "rw"); raf2.setLength(journal.length() - 3); raf2.close()
    val e = intercept[StateFileException](provider(root).getReadStore(6, None))
    assert(e.getMessage.contains("6.hs-journal") && e.getMessage.contains("version 6"), e.getMessage)
  }

  test("forceSnapshotOnCommit writes the snapshot with the commit") {
    val root = tempDir()
    val p = provider(root)
    val s = p.getStore(0, None, true, false); put(s, 1, 1); s.commit()
    assert(files(root) == Seq("1.hs-journal", "1.hs-snapshot"))
    // New local files go through the raw file system: no Hadoop .crc beside them (each file
    // carries its own checksums), and no temporary file left behind.
    assert(storeDir(root).list().filter(_.startsWith(".")).isEmpty, storeDir(root).list().toSeq)
  }

  test(
    "each partition snapshots at the versions of its own phase, so a query's stores do not snapshot in the same batch") {
    import heapstate.engine.StateEngine.{snapshotDueAt, snapshotPhaseOf}
    assert((0 until 4).map(snapshotPhaseOf(_, 10)) == Seq(0, 6, 2, 8))
    assert((0 until 50).forall(p => snapshotPhaseOf(p, 1) == 0 && snapshotPhaseOf(p, 7) < 7))
    // Off its phase (a bulk load's snapshot at version 1), a store gets back on it.
    assert((2L to 30L).find(v => snapshotDueAt(v, 1, 10, 0)).contains(10L))
    assert((2L to 30L).find(v => snapshotDueAt(v, 1, 10, 2)).contains(12L))
    assert((2L to 30L).find(v => snapshotDueAt(v, 1, 10, 6)).contains(6L))
    // A snapshot that could not start at its version stays due; every version is due at interval 1.
    assert((12L to 17L).forall(v => snapshotDueAt(v, 2, 10, 2)) && !snapshotDueAt(11, 2, 10, 2))
    assert((1L to 5L).forall(v => snapshotDueAt(v, v - 1, 1, 0)))

    val root = tempDir()
    val every10 = Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "10")
    val stores = (0 until 4).map(part => provider(root, every10, minVersionsToRetain = 100, partition = part))
    stores.foreach(_.cleanupAfterSnapshots = false) // every snapshot written stays, to be counted
    for (v <- 0 until 25; p <- stores) {
      val s = p.getStore(v, None, false, false); put(s, v % 7, v); s.commit()
      p.doSnapshotMaintenance() // waits for a snapshot the commit started
    }
    val versions = (0 until 4).map(part =>
      Option(storeDir(root, part).listFiles).toSeq.flatten.map(_.getName).filter(_.endsWith(".hs-snapshot"))
        .map(_.stripSuffix(".hs-snapshot").toLong).sorted)
    assert(versions == Seq(Seq(10L, 20L), Seq(6L, 16L), Seq(12L, 22L), Seq(8L, 18L)))
    stores.foreach(_.close())
  }

  test(
    "a first commit of 4 MiB of records onto an empty state writes its snapshot with it, and the next copies from it") {
    // One-long keys and values: 16 bytes each as UnsafeRows, 33 bytes a record with its count.
    val small = tempDir()
    val sp = provider(small)
    val s = sp.getStore(0, None, false, false); (0L until 100000L).foreach(k => put(s, k, k)); s.commit()
    assert(files(small) == Seq("1.hs-journal"), "3.3 MB of records is not a bulk load")
    sp.close()
    // The threshold is a conf: 3.3 MB is a bulk load at 1 MB, and 0 turns bulk loads off.
    def firstCommit(keys: Long, threshold: String): Seq[String] = {
      val root = tempDir()
      val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.bulkLoadSnapshotBytes" -> threshold))
      val s = p.getStore(0, None, false, false); (0L until keys).foreach(k => put(s, k, k)); s.commit(); p.close()
      files(root)
    }
    assert(firstCommit(100000L, "1048576") == Seq("1.hs-journal", "1.hs-snapshot"))
    assert(firstCommit(160000L, "0") == Seq("1.hs-journal"))

    val root = tempDir()
    // Every 4 versions at phase 0: after the bulk load's snapshot, the next is due at version 4 (not before).
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "4"))
    var model = (0L until 160000L).map(k => k -> k).toMap // 5.3 MB
    val s0 = p.getStore(0, None, false, false); model.foreach { case (k, v) => put(s0, k, v) }; s0.commit()
    assert(files(root) == Seq("1.hs-journal", "1.hs-snapshot"))
    val atOne = model
    for (v <- 1 until 4) {
      val st = p.getStore(v, None, false, false); put(st, v * 1000L, -v); model += (v * 1000L) -> -v.toLong; st.commit()
    }
    p.doSnapshotMaintenance() // waits for the background snapshot of version 4 the last commit started
    assert(snapshots(root) == Seq("1.hs-snapshot", "4.hs-snapshot"))
    val s4 = p.getStore(4, None, false, false)
    // At least 1,024 buckets of 4 KiB; three keys changed since version 1, so at most three buckets were compressed again.
    val copied = s4.metrics.customMetrics(HeapStateStoreProvider.BucketsCopied)
    assert(copied >= 1021, s"copied $copied buckets")
    s4.abort(); p.close()
    // Each snapshot holds its version on its own: without the journal of version 1 a fresh provider reads both.
    assert(new File(storeDir(root), "1.hs-journal").delete())
    assertRebuilt(root, Seq(1L, 4L), Map(1L -> atOne, 4L -> model))
  }

  test("off the local disk, local copies go under localCopyDir, and none turns them off") {
    val roots = Seq(new File(tempDir(), "a"), new File(tempDir(), "b")) // made when first needed
    val tmp = new File(System.getProperty("java.io.tmpdir"))
    def inTmp(): Set[String] = Option(tmp.list()).toSeq.flatten.filter(_.startsWith("heapstate-op0-p1-")).toSet
    /**
     * Commits versions 0 to 5 of partition 1, whose snapshot falls due at 6 (phase 2 of 4): the
     * buckets that snapshot copied, and the directories of copies then under the roots and, new,
     * under `java.io.tmpdir` (where they go without localCopyDir in a JVM with no Spark).
     */
    def run(localCopyDir: Option[String]): (Long, Seq[String], Set[String]) = {
      val before = inTmp()
      val p = provider(
        tempDir(),
        Map(
          "spark.sql.streaming.checkpointFileManagerClass" -> StoreFixture.FileContextManager,
          "spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "4"
        ) ++ localCopyDir.map("spark.sql.streaming.stateStore.heapstate.localCopyDir" -> _),
        partition = 1
      )
      val s0 = p.getStore(0, None, false, false); (0L until 160000L).foreach(k => put(s0, k, k));
      s0.commit() // a bulk load
      for (v <- 1 until 6) { val st = p.getStore(v, None, false, false); put(st, v * 1000L, -v); st.commit() }
      p.doSnapshotMaintenance()
      assert(Option(storeDir(p.stateStoreId.checkpointRootLocation, 1).list()).toSeq.flatten.contains("6.hs-snapshot"))
      val s6 = p.getStore(6, None, false, false)
      val copied = s6.metrics.customMetrics(HeapStateStoreProvider.BucketsCopied)
      assert(get(s6, 2000L).contains(-2L) && get(s6, 2001L).contains(2001L))
      s6.abort()
      val underRoots = roots.flatMap(r => Option(r.list()).toSeq.flatten)
      val newInTmp = inTmp() -- before
      p.close()
      assert(roots.forall(r => Option(r.list()).forall(_.isEmpty)) && (inTmp() -- before).isEmpty,
        "close left local copies")
      (copied, underRoots, newInTmp)
    }
    val (copied, underRoots, _) = run(Some(roots.mkString(" , ")))
    assert(copied >= 1021, s"copied $copied buckets")
    assert(underRoots.size == 1 && underRoots.head.startsWith("heapstate-op0-p1-"), underRoots)
    val (byDefault, _, inTmpByDefault) = run(None)
    assert(byDefault >= 1021 && inTmpByDefault.size == 1, s"copied $byDefault buckets; $inTmpByDefault")
    val (none, noneUnderRoots, noneInTmp) = run(Some("none"))
    assert(none == 0 && noneUnderRoots.isEmpty && noneInTmp.isEmpty, s"copied $none buckets with no local copies")
  }

  test("Spark's local directories, in the order Spark takes them") {
    def dirs(conf: Map[String, String], env: Map[String, String]): Seq[String] =
      StateFiles.sparkLocalDirs(conf.get, env.get).map(_.getPath)
    val conf = Map("spark.local.dir" -> "/conf1, /conf2")
    val tmp = System.getProperty("java.io.tmpdir")
    assert(dirs(Map.empty, Map.empty) == Seq(tmp))
    assert(dirs(conf, Map.empty) == Seq("/conf1", "/conf2"))
    assert(dirs(conf, Map("SPARK_LOCAL_DIRS" -> "/l1,/l2")) == Seq("/l1", "/l2"))
    val standalone = Map("SPARK_LOCAL_DIRS" -> "/l1", "SPARK_EXECUTOR_DIRS" -> s"/e1${File.pathSeparator}/e2")
    assert(dirs(conf, standalone) == Seq("/e1", "/e2"))
    // LOCAL_DIRS counts in a YARN container only.
    assert(dirs(conf, standalone + ("LOCAL_DIRS" -> "/y1,/y2")) == Seq("/e1", "/e2"))
    assert(dirs(conf, standalone ++ Map("LOCAL_DIRS" -> "/y1,/y2", "CONTAINER_ID" -> "c1")) == Seq("/y1", "/y2"))
    assert(dirs(Map("spark.local.dir" -> " , "), Map.empty) == Seq(tmp))
  }

  test("change feed and replay from a snapshot") {
    val root = tempDir()
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "2"))
    for (v <- 0 until 4) {
      val s = p.getStore(v, None, false, false); put(s, v, v); if (v == 2) remove(s, 0); s.commit(); p.doMaintenance()
    }
    val feed = p.getStateStoreChangeDataReader(2, 3, None, None).map { case (t, k, v, batch) =>
      (if (t == RecordType.PUT_RECORD) "PUT" else if (t == RecordType.DELETE_RECORD) "DELETE" else t.toString,
        k.getLong(0), Option(v).map(_.getLong(0)), batch)
    }.toList
    assert(feed.sortBy(x => (x._4, x._2)) == List(("PUT", 1L, Some(1L), 1L), ("DELETE", 0L, None, 2L),
      ("PUT", 2L, Some(2L), 2L)))
    val replayed = provider(root).replayStateFromSnapshot(2, 4, readOnly = true, None, None)
    assert(contents(replayed) == Map(1L -> 1L, 2L -> 2L, 3L -> 3L))
    intercept[StateFileException](provider(root).replayStateFromSnapshot(3, 4, readOnly = true, None, None))
  }
}
