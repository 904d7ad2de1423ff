package heapstate

import java.io.{File, RandomAccessFile}

import org.scalatest.funsuite.AnyFunSuite

import heapstate.StoreFixture._
import heapstate.engine.StateEngine
import heapstate.io.StateFileException

/**
 * The corruption matrix: the newest journal and the newest snapshot, each truncated, with bits
 * flipped, or deleted. Where an older snapshot and intact journals can rebuild the version,
 * heapstate recovers by itself and logs a warning naming the damaged file; otherwise it fails
 * with an error naming the file and the version. In no case does it serve state that differs
 * from the model.
 */
class CorruptionSuite extends AnyFunSuite {
  private val Interval = Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "5")
  private val Retain = 6
  private val Versions = 12

  /** The model: version v holds keys 0..v-1 with value key*100 + v; key v % 3 is removed at v. */
  private def model(version: Int): Map[Long, Long] = {
    var m = Map.empty[Long, Long]
    for (v <- 1 to version) {
      m = m.updated(v.toLong, v * 100L + v) + ((v.toLong + 1000) -> v.toLong)
      if (v % 3 == 0) m -= (v / 3).toLong
    }
    m
  }

  /**
   * Commits versions 1 to 12 with maintenance after each: compaction every 5 versions and
   * retention of 6 leave snapshots 5 and 10 and journals 6 to 12.
   */
  private def checkpoint(): String = {
    val root = tempDir()
    val p = provider(root, Interval, minVersionsToRetain = Retain)
    for (v <- 1 to Versions) {
      val s = p.getStore(v - 1L, None, false, false)
      put(s, v, v * 100L + v); put(s, v + 1000L, v)
      if (v % 3 == 0) remove(s, v / 3)
      s.commit()
      p.doMaintenance()
    }
    p.close()
    assert(files(root) == Seq("10.hs-snapshot", "11.hs-journal", "12.hs-journal", "5.hs-snapshot",
      "6.hs-journal", "7.hs-journal", "8.hs-journal", "9.hs-journal", "10.hs-journal").sorted)
    root
  }

  private def files(root: String): Seq[String] =
    storeDir(root).listFiles().map(_.getName).filterNot(_.startsWith(".")).toSeq.sorted

  private sealed trait Damage { def apply(f: File, trial: Int): Unit }
  private case object Truncate extends Damage {
    def apply(f: File, trial: Int): Unit = {
      val raf = new RandomAccessFile(f, "rw")
      try raf.setLength(new scala.util.Random(trial).nextInt(raf.length().toInt))
      finally raf.close()
    }
  }
  private case object FlipBits extends Damage {
    def apply(f: File, trial: Int): Unit = {
      val rnd = new scala.util.Random(trial)
      val raf = new RandomAccessFile(f, "rw")
      try for (_ <- 0 to rnd.nextInt(3)) {
          val at = rnd.nextInt(raf.length().toInt)
          raf.seek(at); val b = raf.read(); raf.seek(at); raf.write(b ^ (1 << rnd.nextInt(8)))
        }
      finally raf.close()
    }
  }
  private case object Delete extends Damage {
    def apply(f: File, trial: Int): Unit = assert(f.delete())
  }
  private val Damages = Seq(Truncate, FlipBits, Delete)
  private val Trials = 8

  /** Loads `version` in a fresh provider, as a restarted query would. */
  private def load(root: String, version: Long): Map[Long, Long] =
    contents(provider(root, Interval, minVersionsToRetain = Retain).getReadStore(version, None))

  private def failure(root: String, version: Long): StateFileException =
    intercept[StateFileException](load(root, version))

  for (damage <- Damages) {
    test(s"newest snapshot, $damage: rebuilt from the older snapshot and journals, with a warning") {
      for (trial <- 0 until (if (damage == Delete) 1 else Trials)) {
        val root = checkpoint()
        damage(new File(storeDir(root), "10.hs-snapshot"), trial)
        val (state, lines) = logged(classOf[StateEngine])(load(root, Versions))
        assert(state == model(Versions), s"trial $trial")
        assert(load(root, 11) == model(11))
        if (damage != Delete) {
          assert(lines.exists { case (_, l) => l.contains("10.hs-snapshot") && l.contains("damaged") }, lines)
        }
      }
    }

    test(s"newest snapshot, $damage, and no intact older one: an error naming the file and version") {
      for (trial <- 0 until (if (damage == Delete) 1 else Trials)) {
        val root = checkpoint()
        damage(new File(storeDir(root), "10.hs-snapshot"), trial)
        FlipBits(new File(storeDir(root), "5.hs-snapshot"), trial)
        val e = failure(root, Versions)
        val named = if (damage == Delete) "5.hs-snapshot" else "10.hs-snapshot"
        assert(e.getMessage.contains(named) && e.getMessage.contains(s"version $Versions"), e.getMessage)
      }
    }

    test(s"newest journal, $damage: its version fails naming the file, the one before is intact") {
      for (trial <- 0 until (if (damage == Delete) 1 else Trials)) {
        val root = checkpoint()
        damage(new File(storeDir(root), s"$Versions.hs-journal"), trial)
        val e = failure(root, Versions)
        assert(e.getMessage.contains(s"$Versions.hs-journal") && e.getMessage.contains(s"version $Versions"),
          e.getMessage)
        assert(load(root, Versions - 1L) == model(Versions - 1))
      }
    }
  }

  test("cleanup does not count an oldest snapshot found damaged as where the journals rebuild from") {
    val root = checkpoint()
    val raf = new RandomAccessFile(new File(storeDir(root), "5.hs-snapshot"), "rw")
    try raf.setLength(10)
    finally raf.close() // refused when opened: not even a header
    // Retaining 100 versions, snapshot 10 is the only start for versions 10 to 14 once 5 is
    // known to be damaged.
    val p = provider(root, Interval, minVersionsToRetain = 100)
    val e = intercept[StateFileException](p.getReadStore(7, None))
    assert(e.getMessage.contains("5.hs-snapshot"), e.getMessage)
    for (v <- Versions + 1 to 16) {
      val s = p.getStore(v - 1L, None, false, false)
      put(s, v, v * 100L + v); put(s, v + 1000L, v)
      if (v % 3 == 0) remove(s, v / 3)
      s.commit()
      p.doMaintenance()
    }
    p.close()
    assert(files(root).contains("10.hs-snapshot") && files(root).contains("15.hs-snapshot"), files(root))
    for (v <- 10 to 16) assert(load(root, v) == model(v), s"version $v")
  }

  test("a damaged journal below the newest snapshot is not needed; with that snapshot gone it is named") {
    val root = checkpoint()
    FlipBits(new File(storeDir(root), "7.hs-journal"), 0)
    assert(load(root, Versions) == model(Versions))
    assert(new File(storeDir(root), "10.hs-snapshot").delete())
    val e = failure(root, Versions)
    assert(e.getMessage.contains("7.hs-journal") && e.getMessage.contains("version 7"), e.getMessage)
  }
}
