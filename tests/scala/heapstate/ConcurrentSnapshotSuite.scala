package heapstate

import java.util.concurrent.atomic.AtomicBoolean

import scala.collection.mutable
import scala.util.Random

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.scalatest.funsuite.AnyFunSuite

import heapstate.engine._
import heapstate.io.{Codec, StateFileNames, StateFiles}

/**
 * Snapshots written by another thread while commits go on must hold exactly the state of the
 * version they name: this is the undo-log snapshot view's whole claim.
 */
class ConcurrentSnapshotSuite extends AnyFunSuite {
  test("snapshots taken during commits equal the model at their version") {
    val seed = Random.nextLong()
    info(s"seed $seed")
    val rng = new Random(seed)
    val dir = new Path(StoreFixture.tempDir(), "store")
    val files = new StateFiles(dir, new Configuration(), 0)
    val engine = new StateEngine(files, EngineSettings(1, Codec.Lz4, 2, 1000, snapshotBucketBytes = 256), None)
    def key(i: Int) = Key(java.nio.ByteBuffer.allocate(8).putLong(i.toLong).array())
    def value(v: Long) = java.nio.ByteBuffer.allocate(8).putLong(v).array()
    val models = mutable.Map[Long, Map[Int, Long]](0L -> Map.empty)
    var model = Map.empty[Int, Long]
    engine.ensureAt(0)
    // Start with a state large enough that a snapshot takes a while.
    val warm = new ChangeSet(engine.live)
    (0 until 50000).foreach { i =>
      val k = key(i); warm.put(k, Entry(k.bytes, value(i))); model += i -> i.toLong
    }
    engine.commit(0, warm); models(1L) = model
    val stop = new AtomicBoolean(false)
    val written = mutable.ArrayBuffer.empty[Long]
    val commits = new java.util.concurrent.atomic.AtomicLong
    // After each snapshot the snapshotter waits for two commits to end: the second began after
    // the snapshot ended, so it writes in place and moves back what was appended meanwhile.
    // What ends the snapshot thread other than `stop`: rethrown below, since a thread's exception
    // would otherwise only be printed, and the test would fail later on a symptom of it.
    val snapshotterFailure = new java.util.concurrent.atomic.AtomicReference[Throwable]()
    val snapshotter = new Thread(() =>
      try {
        while (!stop.get()) {
          engine.snapshotIfDue(force = true).foreach(v => written.synchronized(written += v))
          val after = commits.get
          while (!stop.get() && commits.get < after + 2) Thread.onSpinWait()
        }
      } catch { case e: Throwable => snapshotterFailure.set(e) })
    snapshotter.setDaemon(true)
    snapshotter.start()
    // At least 199 commits, and then more until what the assertions below need has happened at
    // least once (up to a cap): a snapshot view costs one look-up per undo entry above its version
    // for each entry, and every commit during it adds one, so a snapshot thread held up for a
    // moment may not finish until the commits stop, and a fixed count can end with too few
    // snapshots and nothing moved or written in place. The commits after the 199th leave the
    // snapshot thread 5 ms each, so that a view behind them catches up.
    def seenEnough: Boolean = written.synchronized(written.size) >= 3 && engine.live.compactedBytes > 0 &&
      engine.live.writtenInPlace > 0 && engine.live.movedBackBytes > 0
    var v = 1L
    try {
      while (v < 200L || (!seenEnough && v < 1200L)) {
        if (v >= 200L) Thread.sleep(5)
        val cs = new ChangeSet(engine.live)
        for (_ <- 0 until 500) {
          val k = rng.nextInt(60000)
          if (rng.nextInt(4) == 0) { cs.remove(key(k)); model -= k }
          else { val x = rng.nextLong(); val kk = key(k); cs.put(kk, Entry(kk.bytes, value(x))); model += k -> x }
        }
        engine.commit(v, cs); models(v + 1) = model
        commits.incrementAndGet()
        v += 1
      }
    } finally { stop.set(true); snapshotter.join() }
    info(s"${v - 1} commits after the first")
    Option(snapshotterFailure.get).foreach(e => throw new AssertionError(s"seed $seed: the snapshot thread failed", e))
    // The live state itself, and its memory count, after all that.
    val live = mutable.Map.empty[Int, Long]
    engine.live.iterator.foreach { a =>
      val page = engine.live.pageOf(a); val at = engine.live.offsetOf(a)
      live(java.nio.ByteBuffer.wrap(Entry.key(page, at)).getLong.toInt) =
        java.nio.ByteBuffer.wrap(Entry.value(page, at)).getLong
    }
    assert(live.toMap == model, s"seed $seed: the live state differs from the model")
    val (counted, recounted) = engine.memoryAccounts
    assert(counted == recounted, s"seed $seed: the live state's running memory count")
    // Compaction ran between the views (it waits while one is open) and moved entries the views
    // and the snapshot files then read; commits made while no snapshot was being written wrote
    // their updates in place, over entries that earlier views had read, and moved the updates
    // appended during the snapshots back over their old entries.
    assert(engine.live.compactedBytes > 0, s"seed $seed: the live table's compaction moved nothing")
    assert(engine.live.writtenInPlace > 0, s"seed $seed: no update was written in place between the snapshots")
    assert(engine.live.movedBackBytes > 0,
      s"seed $seed: no update appended during a snapshot went back over its old entry")
    info(s"compaction moved ${engine.live.compactedBytes} bytes; ${engine.live.writtenInPlace} updates written in " +
      s"place; ${engine.live.movedBackBytes} bytes of appended updates moved back")
    val versions = written.synchronized(written.toList)
    assert(versions.size >= 3, s"seed $seed: only ${versions.size} snapshots were written during the run")
    // Every snapshot after the first had one before it, and a few commits' keys touch few buckets.
    assert(engine.snapshotBucketsReused > 0, s"seed $seed: no snapshot copied a bucket from the one before it")
    assert(engine.snapshotsFromChangedBuckets > 0, s"seed $seed: no snapshot viewed the changed buckets' keys alone")
    // Snapshots are overwritten by later ones only at the same version; read each survivor.
    val onDisk = files.list().filter(_.kind == StateFileNames.Snapshot)
    assert(onDisk.nonEmpty)
    for (f <- onDisk) {
      val got = mutable.Map.empty[Int, Long]
      files.read(f)(
        (k, v) => {
          val kk = java.nio.ByteBuffer.wrap(k).getLong.toInt
          val vv = java.nio.ByteBuffer.wrap(v).getLong
          assert(got.get(kk).forall(_ == vv),
            s"seed $seed: key $kk repeated with another value in snapshot ${f.version}")
          got(kk) = vv
        },
        _ => fail("delete in snapshot")
      )
      assert(got.toMap == models(f.version), s"seed $seed: snapshot of version ${f.version} differs from the model")
    }
    info(s"${onDisk.size} snapshots checked, versions ${onDisk.map(_.version).mkString(",")}")
  }
}
