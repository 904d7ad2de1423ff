package heapstate

import java.util.concurrent.{CountDownLatch, Executors, TimeUnit}

import scala.concurrent.{Await, ExecutionContext, Future}
import scala.concurrent.duration._

import org.apache.spark.sql.execution.streaming.state.{RecordType, StateStore, StateStoreCheckpointInfo}
import org.scalatest.funsuite.AnyFunSuite

import heapstate.StoreFixture._
import heapstate.io.StateFileException

/**
 * Checkpoint format version 2 (unique checkpoint ids), and attempts that commit one version twice:
 * a retried task, a speculative copy, a zombie on another executor. Every version Spark names by
 * its id must load as exactly that attempt's state, from memory and from files.
 */
class CheckpointFormatV2Suite extends AnyFunSuite {
  private val V2 = Map("spark.sql.streaming.stateStore.checkpointFormatVersion" -> "2")
  private val V2Compact2 = V2 + ("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "2")

  private def files(root: String): Seq[String] =
    Option(storeDir(root).listFiles).toSeq.flatten.map(_.getName).filterNot(_.startsWith(".")).sorted

  /** Opens `version` (checkpoint id `id`), applies `changes` (value < 0: remove), commits. */
  private def commit(
      p: HeapStateStoreProvider,
      version: Long,
      id: Option[String],
      changes: (Long, Long)*): StateStoreCheckpointInfo = {
    val s = p.getStore(version, id, false, false)
    changes.foreach { case (k, v) => if (v < 0) remove(s, k) else put(s, k, v) }
    assert(s.commit() == version + 1)
    s.getStateStoreCheckpointInfo()
  }

  private def apply(model: Map[Long, Long], changes: (Long, Long)*): Map[Long, Long] =
    changes.foldLeft(model) { case (m, (k, v)) => if (v < 0) m - k else m + (k -> v) }

  test("format v2: each commit returns a fresh id and its base id, and files carry the lineage") {
    val root = tempDir()
    val p = provider(root, V2)
    val c1 = commit(p, 0, None, 1L -> 1L)
    val c2 = commit(p, 1, c1.stateStoreCkptId, 2L -> 2L)
    assert(c1.batchVersion == 1 && c2.batchVersion == 2)
    assert(c1.stateStoreCkptId.isDefined && c2.stateStoreCkptId.isDefined && c1.stateStoreCkptId != c2.stateStoreCkptId)
    assert(c1.baseStateStoreCkptId.isEmpty, "version 1 sits on the empty version 0")
    assert(c2.baseStateStoreCkptId == c1.stateStoreCkptId)
    assert(files(root) == Seq(s"1_${c1.stateStoreCkptId.get}.hs-journal",
      s"2_${c2.stateStoreCkptId.get}_${c1.stateStoreCkptId.get}.hs-journal").sorted)
    assert(contents(provider(root, V2).getReadStore(2, c2.stateStoreCkptId)) == Map(1L -> 1L, 2L -> 2L))
  }

  test("format v2: getStore(v, Some(id)) loads exactly that attempt, in memory and from files") {
    val root = tempDir()
    val p = provider(root, V2Compact2)
    val c1 = commit(p, 0, None, 1L -> 1L, 2L -> 2L)
    // Two attempts at version 2 on one executor: a task that committed, then was retried.
    val a = commit(p, 1, c1.stateStoreCkptId, 3L -> 3L)
    p.doMaintenance() // a snapshot of attempt a's version 2
    val b = commit(p, 1, c1.stateStoreCkptId, 1L -> -1L, 4L -> 4L)
    val stateA = Map(1L -> 1L, 2L -> 2L, 3L -> 3L)
    val stateB = Map(2L -> 2L, 4L -> 4L)
    assert(a.stateStoreCkptId != b.stateStoreCkptId)
    assert(a.baseStateStoreCkptId == c1.stateStoreCkptId && b.baseStateStoreCkptId == c1.stateStoreCkptId)
    assert(files(root).contains(s"2_${a.stateStoreCkptId.get}.hs-snapshot"), files(root))
    // Live on b; asking for a rebuilds a's lineage from its snapshot, then b comes back from journals.
    assert(contents(p.getStore(2, b.stateStoreCkptId, false, false)) == stateB)
    assert(contents(p.getStore(2, a.stateStoreCkptId, false, false)) == stateA)
    assert(contents(p.getStore(2, b.stateStoreCkptId, false, false)) == stateB)
    assert(contents(p.getStore(1, c1.stateStoreCkptId, false, false)) == Map(1L -> 1L, 2L -> 2L))
    for (restarted <- Seq(provider(root, V2), provider(root, V2))) {
      assert(contents(restarted.getReadStore(2, a.stateStoreCkptId)) == stateA)
      assert(contents(restarted.getReadStore(2, b.stateStoreCkptId)) == stateB)
    }
    // Without an id, two attempts at one version are ambiguous: an error naming the version.
    val e = intercept[StateFileException](provider(root, V2).getReadStore(2, None))
    assert(e.version == 2 && e.getMessage.contains("2 attempts") && e.getMessage.contains(a.stateStoreCkptId.get))
  }

  test("format v2: restarts continue the lineage Spark names, across snapshots and cleanup") {
    val root = tempDir()
    var model = Map.empty[Long, Long]
    var id: Option[String] = None
    var p = provider(root, V2Compact2, minVersionsToRetain = 3)
    val rnd = new scala.util.Random(7)
    for (v <- 0L until 24L) {
      if (v % 5 == 4) p = provider(root, V2Compact2, minVersionsToRetain = 3) // a restart
      val changes = Seq.fill(5)((rnd.nextInt(20).toLong, if (rnd.nextInt(4) == 0) -1L else rnd.nextInt(1000).toLong))
      if (v % 3 == 1) commit(p, v, id, (99L, v)) // an attempt Spark will not keep
      val info = commit(p, v, id, changes: _*)
      model = apply(model, changes: _*)
      id = info.stateStoreCkptId
      p.doMaintenance()
      assert(contents(p.getStore(v + 1, id, false, false)) == model, s"version ${v + 1}")
    }
    assert(contents(provider(root, V2).getReadStore(24, id)) == model)
    // Cleanup bounds the files: nothing below the newest snapshot at or under version 22 is left.
    val versions = files(root).map(_.takeWhile(_.isDigit).toLong)
    assert(versions.min >= 20, files(root))
  }

  test("format v2: cleanups after the store's own snapshots keep every retained version of the named lineage") {
    val root = tempDir()
    // No maintenance: only the cleanups commits hand to the background once a snapshot is below
    // the live version. Every fourth version also has an attempt Spark does not keep (a retried
    // task), committed first, whose snapshot may be written too.
    val p = provider(root, V2Compact2, minVersionsToRetain = 6)
    val rnd = new scala.util.Random(11)
    var model = Map.empty[Long, Long]
    val kept = scala.collection.mutable.Map(0L -> (Option.empty[String], model))
    for (v <- 0L until 30L) {
      val id = kept(v)._1
      if (v % 4 == 1) { commit(p, v, id, (99L, v)); p.awaitBackground() }
      val changes = Seq.fill(4)((rnd.nextInt(12).toLong, if (rnd.nextInt(4) == 0) -1L else rnd.nextInt(1000).toLong))
      val info = commit(p, v, id, changes: _*)
      model = apply(model, changes: _*)
      kept(v + 1) = (info.stateStoreCkptId, model)
      p.awaitBackground()
    }
    // Versions 25 to 30 are retained, and the snapshot they are rebuilt from lies at most 6 / 2 = 3
    // versions below 25: nothing below 22 may stay. Without the cleanups, every file from 1 would.
    val versions = files(root).map(_.takeWhile(_.isDigit).toLong)
    assert(versions.min >= 22 && versions.max == 30, files(root))
    p.close()
    for (v <- 25L to 30L) {
      val (id, state) = kept(v)
      assert(contents(provider(root, V2).getReadStore(v, id)) == state, s"version $v")
    }
  }

  test("zombie, format v2: two executors commit one version at once; the version Spark keeps loads exactly") {
    for (_ <- 0 until 20) zombieV2()
  }

  private def zombieV2(): Unit = {
    val root = tempDir()
    val driverSide = provider(root, V2)
    val c1 = commit(driverSide, 0, None, 1L -> 1L, 2L -> 2L)
    val (execA, execB) = (provider(root, V2), provider(root, V2))
    execA.getStore(1, c1.stateStoreCkptId, false, false).abort()
    execB.getStore(1, c1.stateStoreCkptId, false, false).abort()
    val pool = Executors.newFixedThreadPool(2)
    implicit val ec: ExecutionContext = ExecutionContext.fromExecutor(pool)
    val go = new CountDownLatch(1)
    def attempt(p: HeapStateStoreProvider, changes: (Long, Long)*) =
      Future { go.await(); commit(p, 1, c1.stateStoreCkptId, changes: _*) }
    val fa = attempt(execA, 3L -> 30L)
    val fb = attempt(execB, 1L -> -1L, 3L -> 31L)
    go.countDown()
    val (a, b) = (Await.result(fa, 30.seconds), Await.result(fb, 30.seconds))
    pool.shutdown(); pool.awaitTermination(10, TimeUnit.SECONDS)
    val stateB = Map(2L -> 2L, 3L -> 31L)
    // Spark kept b. The zombie a writes its snapshot afterwards; it must not leak into b's lineage.
    execA.doMaintenance()
    execA.getStore(2, a.stateStoreCkptId, true, false).commit() // a even snapshots a version 3 of its own
    // The next batch lands on the zombie's executor: it must leave a's live state for b's.
    val c3 = commit(execA, 2, b.stateStoreCkptId, 4L -> 4L)
    assert(c3.baseStateStoreCkptId == b.stateStoreCkptId)
    val expected = stateB + (4L -> 4L)
    assert(contents(execA.getStore(3, c3.stateStoreCkptId, false, false)) == expected)
    assert(contents(provider(root, V2).getReadStore(3, c3.stateStoreCkptId)) == expected)
    assert(contents(provider(root, V2).getReadStore(2, b.stateStoreCkptId)) == stateB)
    assert(contents(provider(root, V2).getReadStore(2, a.stateStoreCkptId)) == Map(1L -> 1L, 2L -> 2L, 3L -> 30L))
  }

  test("zombie, format v1: two attempts commit one version, at once or one after the other; it loads whole") {
    for (_ <- 0 until 10; concurrent <- Seq(true, false); sameOutput <- Seq(true, false)) {
      val root = tempDir()
      val c = provider(root); commit(c, 0, None, 1L -> 1L, 2L -> 2L)
      val (execA, execB) = (provider(root), provider(root))
      val changesA = Seq(3L -> 30L)
      val changesB = if (sameOutput) changesA else Seq(1L -> -1L, 3L -> 31L)
      val stateA = Map(1L -> 1L, 2L -> 2L, 3L -> 30L)
      val stateB = apply(Map(1L -> 1L, 2L -> 2L), changesB: _*)
      if (concurrent) {
        val pool = Executors.newFixedThreadPool(2)
        implicit val ec: ExecutionContext = ExecutionContext.fromExecutor(pool)
        val go = new CountDownLatch(1)
        val fs = Seq(execA -> changesA, execB -> changesB).map { case (p, ch) =>
          Future { go.await(); commit(p, 1, None, ch: _*) }
        }
        go.countDown()
        fs.foreach(f => Await.result(f, 30.seconds))
        pool.shutdown()
      } else {
        commit(execA, 1, None, changesA: _*)
        commit(execB, 1, None, changesB: _*)
      }
      val loaded = contents(provider(root).getReadStore(2, None))
      assert(loaded == stateA || loaded == stateB, s"concurrent=$concurrent sameOutput=$sameOutput: $loaded")
      if (!concurrent) assert(loaded == stateB, "the later attempt's journal replaces the earlier one")
      if (sameOutput) assert(loaded == stateA)
    }
  }

  test("format v2: change feed and replay follow the named lineage") {
    val root = tempDir()
    val p = provider(root, V2Compact2)
    val c1 = commit(p, 0, None, 1L -> 1L)
    val c2 = commit(p, 1, c1.stateStoreCkptId, 2L -> 2L)
    p.doMaintenance() // snapshot of version 2
    commit(p, 2, c2.stateStoreCkptId, 3L -> 99L) // an attempt at version 3 Spark drops
    val c3 = commit(p, 2, c2.stateStoreCkptId, 1L -> -1L, 3L -> 3L)
    val c4 = commit(p, 3, c3.stateStoreCkptId, 4L -> 4L)
    val feed =
      provider(root, V2).getStateStoreChangeDataReader(3, 4, None, c4.stateStoreCkptId).map { case (t, k, v, batch) =>
        (if (t == RecordType.PUT_RECORD) "PUT" else "DELETE", k.getLong(0), Option(v).map(_.getLong(0)), batch)
      }.toList
    assert(feed.sortBy(x => (x._4, x._2)) == List(("DELETE", 1L, None, 2L), ("PUT", 3L, Some(3L), 2L),
      ("PUT", 4L, Some(4L), 3L)))
    val replayed =
      provider(root, V2).replayStateFromSnapshot(2, 4, readOnly = true, c2.stateStoreCkptId, c4.stateStoreCkptId)
    assert(contents(replayed) == Map(2L -> 2L, 3L -> 3L, 4L -> 4L))
    val wrongStart = intercept[StateFileException](
      provider(root, V2).replayStateFromSnapshot(2, 4, readOnly = true, c1.stateStoreCkptId, c4.stateStoreCkptId))
    assert(wrongStart.version == 2 && wrongStart.getMessage.contains("does not descend"))
  }

  test("format v2: a damaged newest snapshot of the lineage falls back to journals") {
    val root = tempDir()
    val p = provider(root, V2Compact2)
    var id: Option[String] = None
    for (v <- 0L until 4L) { id = commit(p, v, id, v -> v).stateStoreCkptId; p.doMaintenance() }
    val snap = new java.io.File(storeDir(root), s"4_${id.get}.hs-snapshot")
    assert(snap.exists(), files(root))
    val raf = new java.io.RandomAccessFile(snap, "rw"); raf.seek(30); raf.write(raf.read() ^ 0xff); raf.close()
    assert(contents(provider(root, V2).getReadStore(4, id)) == Map(0L -> 0L, 1L -> 1L, 2L -> 2L, 3L -> 3L))
  }

  test("checkpoint format versions above 2 are refused, naming the store") {
    val e = intercept[UnsupportedOperationException](
      provider(tempDir(), Map("spark.sql.streaming.stateStore.checkpointFormatVersion" -> "3")))
    assert(e.getMessage.contains("checkpointFormatVersion=3"))
  }

  test("format v1 stores report no checkpoint ids") {
    val info = commit(provider(tempDir()), 0, None, 1L -> 1L)
    assert(info == StateStoreCheckpointInfo(0, 1, None, None))
    assert(StateStore.DEFAULT_COL_FAMILY_NAME == "default")
  }
}
