package heapstate

import org.scalatest.funsuite.AnyFunSuite

import heapstate.engine.{SnapshotPacer, StateEngine}

/** The background snapshot's pacing, on a fake clock. */
class SnapshotPacerSuite extends AnyFunSuite {
  private val MiB = 1 << 20
  private val Ms = 1000000L

  /**
   * A pacer on clocks that only move when the test works (`work`) or the pacer parks: the wall
   * clock by the work and any wait for a core, the thread's CPU clock by the work alone.
   */
  private final class Rig(dutyCycle: Double, abandonAfterParks: Int = Int.MaxValue,
      restWhenIdle: Option[Boolean] = Some(true)) {
    var now = 0L
    var cpu = 0L
    var abandonNow = false
    /** The tasks are busy (a store written or a commit running) until the wall clock reaches this. */
    var busyUntil = 0L
    val parks = scala.collection.mutable.ArrayBuffer.empty[Long]
    private val abandonIt = () => abandonNow || parks.length >= abandonAfterParks
    private val parkIt = (n: Long) => { parks += n; now += n }
    /** What the pacer counted as written beside busy tasks, past its budget for waiting. */
    var beside = 0L
    val pacer = restWhenIdle match {
      case Some(rest) =>
        new SnapshotPacer(dutyCycle, abandonIt, () => now, parkIt, () => cpu, () => now < busyUntil, rest,
          n => beside += n)
      case None => // the default, which follows StateEngine.taskPluginActive
        new SnapshotPacer(dutyCycle, abandonIt, () => now, parkIt, () => cpu, () => now < busyUntil,
          besideTasks = n => beside += n)
    }
    /** Works `ms` milliseconds of CPU, after waiting `waitedMs` for a core, then reports `bytes` written. */
    def work(ms: Long, bytes: Int = MiB, waitedMs: Long = 0): Unit = {
      now += (ms + waitedMs) * Ms; cpu += ms * Ms; pacer.wrote(bytes)
    }
  }

  test("after each MiB a snapshot rests so that it works its duty cycle: a third rests twice its work") {
    val rig = new Rig(1.0 / 3)
    rig.work(10)
    rig.work(30)
    assert(rig.parks == Seq(20 * Ms, 60 * Ms))
    assert(rig.now == 120 * Ms)
  }

  test("time spent waiting for a core is not work: the rest completes the cycle the CPU time asks for") {
    val rig = new Rig(1.0 / 3)
    rig.work(10, waitedMs = 15) // 10 ms of CPU in 25 ms: the cycle lasts 30 ms
    rig.work(10, waitedMs = 30) // 10 ms of CPU in 40 ms: already past its 30 ms, no rest
    rig.work(10)
    assert(rig.parks == Seq(5 * Ms, 20 * Ms))
    assert(rig.cpu == 30 * Ms && rig.now == 100 * Ms)
  }

  test("the work of a chunk counts from the end of the last rest, across small writes") {
    val rig = new Rig(0.5)
    rig.work(4, MiB / 2)
    assert(rig.parks.isEmpty, "half a MiB: no rest yet")
    rig.work(6, MiB / 2)
    assert(rig.parks == Seq(10 * Ms))
  }

  test("a duty cycle of 1 never rests") {
    val rig = new Rig(1.0)
    for (_ <- 1 to 3) rig.work(10)
    assert(rig.parks.isEmpty && rig.now == 30 * Ms)
  }

  test("tasks that get busy within a chunk end it at the next write: the chunk rests for the work it did, then waits") {
    val rig = new Rig(1.0 / 3)
    rig.work(2, MiB / 8)
    assert(rig.parks.isEmpty, "tasks idle, an eighth of a MiB: no pause")
    rig.busyUntil = 23 * Ms // a task opens a store now, at 2 ms, and commits it at 23 ms
    rig.work(1, MiB / 8)
    assert(rig.parks == Seq(6 * Ms) ++ Seq.fill(14)(Ms), "3 ms of work rest 6 ms, then wait from 9 ms to 23 ms")
    assert(rig.now == 23 * Ms)
    rig.work(1, MiB / 8)
    assert(rig.parks.length == 15, "the tasks are done: the next chunk counts from 23 ms and runs on")
    rig.work(9, MiB - MiB / 8)
    assert(rig.parks.drop(15) == Seq(20 * Ms), "a MiB after the wait: the rest for its 10 ms of work")
  }

  test("with the tasks always busy, small writes still get a ninth of the wall time as work") {
    val rig = new Rig(1.0 / 3)
    rig.busyUntil = Long.MaxValue
    // About 0.1 ms of CPU for each write of 32 KiB: a MiB every 3.2 ms of work.
    val writeNs = 100000L
    var writes = 0
    while (rig.now < 3000 * Ms) {
      rig.now += writeNs; rig.cpu += writeNs; rig.pacer.wrote(MiB / 32)
      writes += 1
    }
    val share = rig.cpu.toDouble / rig.now
    assert(share >= 1.0 / 9 - 0.01 && share <= 1.0 / 3, s"work share $share over ${rig.now / Ms} ms and $writes writes")
    assert(rig.parks.count(_ == Ms).toDouble * Ms <= 2.0 / 3 * rig.now + Ms,
      "waited for the tasks more than two thirds of the time")
  }

  test("a snapshot gives up at its next pause when a task needs the state, before or after resting") {
    val before = new Rig(1.0 / 3)
    before.abandonNow = true
    intercept[SnapshotPacer.Abandoned](before.work(10))
    assert(before.parks.isEmpty)
    val after = new Rig(1.0 / 3, abandonAfterParks = 1)
    intercept[SnapshotPacer.Abandoned](after.work(10))
    assert(after.parks == Seq(20 * Ms))
  }

  test("after its rest a chunk waits, a millisecond at a time, until no commit runs") {
    val rig = new Rig(1.0 / 3)
    rig.busyUntil = 52 * Ms
    rig.work(10) // rests to 30 ms, then waits for the commit
    assert(rig.parks == Seq(20 * Ms) ++ Seq.fill(22)(Ms))
    assert(rig.now == 52 * Ms)
    rig.work(10) // no commit now: the rest alone
    assert(rig.parks.drop(23) == Seq(20 * Ms) && rig.now == 82 * Ms)
  }

  test("a snapshot waits for commits at most two thirds of its wall time: never more than three times slower") {
    val rig = new Rig(1.0 / 3)
    rig.busyUntil = Long.MaxValue // some commit always runs
    rig.work(10)
    assert(rig.now == 90 * Ms, "30 ms of work and rest, then 60 ms waiting: two thirds of 90")
    rig.work(10)
    assert(rig.now == 180 * Ms, "180 ms for two chunks that take 60 ms with no commit running: three times as long")
    assert(rig.parks.count(_ == Ms) == 120)
  }

  test("bytes written while the tasks are busy and the budget is spent are counted; those before it ran out are not") {
    val rig = new Rig(1.0 / 3)
    rig.busyUntil = Long.MaxValue
    rig.work(10, 1000) // room in the budget: the chunk ends, rests 20 ms, and waits until the budget is spent
    assert(rig.beside == 0 && rig.now == 90 * Ms)
    rig.work(0, 2000) // spent, at the same instant: written beside the tasks, and counted
    rig.work(0, 3000)
    assert(rig.beside == 5000)
    rig.work(3, 4000) // 3 ms later the budget has 2 ms of room again: the chunk ends and waits, uncounted
    assert(rig.beside == 5000 && rig.now > 93 * Ms)
    rig.busyUntil = 0
    rig.work(0, 6000)
    assert(rig.beside == 5000, "idle tasks: not counted")
  }

  test("a snapshot waiting for a commit gives up when a task needs the state") {
    val rig = new Rig(1.0 / 3, abandonAfterParks = 6)
    rig.busyUntil = Long.MaxValue
    intercept[SnapshotPacer.Abandoned](rig.work(10))
    assert(rig.parks == Seq(20 * Ms) ++ Seq.fill(5)(Ms), "the rest, then five polls, and no wait after the abandon")
  }

  test("with the plugin, a chunk that met no busy task takes no rest; one that did rests, then waits") {
    val rig = new Rig(1.0 / 3, restWhenIdle = Some(false))
    rig.work(10)
    rig.work(30)
    assert(rig.parks.isEmpty && rig.now == 40 * Ms, "two MiB on idle cores: no rest")
    rig.work(2, MiB / 8)
    rig.busyUntil = 65 * Ms // a task opens a store now, at 42 ms, and commits it at 65 ms
    rig.work(1, MiB / 8)
    assert(rig.parks == Seq(6 * Ms) ++ Seq.fill(16)(Ms), "3 ms of work rest 6 ms, then wait from 49 ms to 65 ms")
    rig.work(1, MiB / 8)
    rig.work(9, MiB - MiB / 8)
    assert(rig.parks.length == 17 && rig.now == 75 * Ms, "the tasks are done: the next MiB runs without a rest")
  }

  test("with the plugin and the tasks always busy, small writes still get a ninth of the wall time as work") {
    val rig = new Rig(1.0 / 3, restWhenIdle = Some(false))
    rig.busyUntil = Long.MaxValue
    val writeNs = 100000L
    while (rig.now < 3000 * Ms) { rig.now += writeNs; rig.cpu += writeNs; rig.pacer.wrote(MiB / 32) }
    val share = rig.cpu.toDouble / rig.now
    assert(share >= 1.0 / 9 - 0.01 && share <= 1.0 / 3, s"work share $share over ${rig.now / Ms} ms")
  }

  test("by default an idle chunk rests unless TaskActivityPlugin counts the tasks") {
    assert(!StateEngine.taskPluginActive, "another suite left the plugin's executor counted")
    val without = new Rig(1.0 / 3, restWhenIdle = None)
    without.work(10)
    assert(without.parks == Seq(20 * Ms))
    StateEngine.taskPluginStarted(2)
    try {
      val counted = new Rig(1.0 / 3, restWhenIdle = None)
      counted.work(10)
      assert(counted.parks.isEmpty && counted.now == 10 * Ms)
    } finally StateEngine.taskPluginStopped()
  }

  test("a duty cycle outside (0, 1] is refused") {
    intercept[IllegalArgumentException](new SnapshotPacer(0, () => false))
    intercept[IllegalArgumentException](new SnapshotPacer(1.5, () => false))
  }

  test(
    "a store's report to Spark's coordinator is counted as part of its commit, which a background snapshot yields to") {
    import StoreFixture._
    val p = provider(tempDir(), Map("spark.sql.streaming.stateStore.commitValidation.enabled" -> "true"))
    val reports = scala.collection.mutable.ArrayBuffer.empty[(Long, Int)]
    p.reportCommit =
      (version, id, _) => { assert(id.partitionId == 0); reports += ((version, StateEngine.commitsRunning)) }
    for (v <- 0 until 3) {
      val s = p.getStore(v.toLong, None, false, false)
      put(s, v.toLong, v.toLong)
      assert(s.commit() == v + 1L)
    }
    assert(reports.toList == List((1L, 1), (2L, 1), (3L, 1)), "each version reported once, while counted as a commit")
    assert(StateEngine.commitsRunning == 0)
    // A report that fails leaves no commit counted.
    p.reportCommit = (_, _, _) => throw new IllegalStateException("coordinator unreachable")
    val s = p.getStore(3, None, false, false)
    put(s, 3, 3)
    intercept[IllegalStateException](s.commit())
    assert(StateEngine.commitsRunning == 0, "a failed report left the count raised")
    p.close()
  }

  test(
    "StateEngine counts the commits running, which is what a real pacer waits on; a failed commit is not left counted") {
    import StoreFixture._
    val root = tempDir()
    // No snapshot falls due in 21 versions: a background one would write into the store's
    // directory while the test below replaces it with a plain file.
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "100"))
    val seen = new java.util.concurrent.atomic.AtomicInteger()
    val done = new java.util.concurrent.atomic.AtomicBoolean(false)
    val watcher = new Thread(() => while (!done.get) if (StateEngine.commitsRunning > 0) seen.incrementAndGet())
    assert(StateEngine.commitsRunning == 0)
    watcher.start()
    try {
      for (v <- 0 until 20) {
        val s = p.getStore(v.toLong, None, false, false)
        for (k <- 0 until 20000) put(s, k + v * 1000L, v.toLong)
        assert(s.commit() == v + 1L)
      }
    } finally { done.set(true); watcher.join() }
    assert(seen.get > 0, "a commit of 20,000 keys ran twenty times and the count never rose above 0")
    assert(StateEngine.commitsRunning == 0, "the count after the last commit returned")
    // A journal that cannot be written (a plain file where the store's directory was) fails the
    // commit, which must not stay counted.
    val s = p.getStore(20, None, false, false)
    put(s, 1, 1)
    val dir = storeDir(root)
    dir.listFiles().foreach(_.delete())
    assert(dir.delete())
    java.nio.file.Files.write(dir.toPath, Array[Byte](1))
    intercept[Exception](s.commit())
    assert(StateEngine.commitsRunning == 0, "a failed commit left the count raised")
    p.close()
  }

  test(
    "one paced snapshot writes at a time in the JVM, though both heapstate's thread and Spark's maintenance thread write them") {
    import StoreFixture._
    // Two stores with snapshots due at once: each commit queues its store's snapshot for the
    // snapshot thread, and "maintenance" on two more threads takes over whichever is still
    // queued, as Spark's maintenance thread does. Before the JVM-wide permit, the snapshot
    // thread and a maintenance thread each wrote one, at a third of a core each.
    // Two checkpoints' partition 0, so that the two stores share a phase (see StateEngine.snapshotDueAt).
    val roots = Seq(tempDir(), tempDir())
    val every2 = Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "2")
    val stores = roots.map(root => provider(root, every2))
    // Version 1 is a bulk load, snapshotted with its commit; the next snapshot is due at version 2.
    for (p <- stores; v <- 0 to 1) {
      val s = p.getStore(v.toLong, None, false, false)
      for (k <- 0 until (if (v == 0) 300000 else 10)) put(s, k, k * 7L + v)
      assert(s.commit() == v + 1L)
    }
    val start = new java.util.concurrent.CountDownLatch(1)
    val maintenance = stores.map(p => new Thread(() => { start.await(); p.doSnapshotMaintenance() }))
    maintenance.foreach(_.start())
    start.countDown()
    maintenance.foreach(_.join())
    for (root <- roots) {
      assert(new java.io.File(storeDir(root), "2.hs-snapshot").isFile, s"$root has no snapshot of version 2")
      val reopened = provider(root)
      assert(contents(reopened.getReadStore(2)) == ((0 until 300000).map(k =>
        k.toLong -> (k * 7L + (if (k < 10) 1 else 0))).toMap))
      reopened.close()
    }
    assert(StateEngine.mostSnapshotsAtOnce == 1, "two paced snapshots wrote at the same time")
    stores.foreach(_.close())
  }

  test(
    "a snapshot waiting for the permit gives up when it is no longer wanted, or when its thread is interrupted (leaving the flag set)") {
    // The permit is taken by a "snapshot" that runs until the test lets it go.
    val holding = new java.util.concurrent.CountDownLatch(1)
    val release = new java.util.concurrent.CountDownLatch(1)
    val holder =
      new Thread(() => StateEngine.oneSnapshotAtATime(() => true) { holding.countDown(); release.await(); None })
    holder.start()
    holding.await()
    val wanted = new java.util.concurrent.atomic.AtomicBoolean(true)
    val ran = new java.util.concurrent.atomic.AtomicBoolean(false)
    val results = new java.util.concurrent.ConcurrentLinkedQueue[Option[Int]]()
    val flagged = new java.util.concurrent.atomic.AtomicBoolean(false)
    val unwanted =
      new Thread(() => results.add(StateEngine.oneSnapshotAtATime(() => wanted.get) { ran.set(true); Some(1) }))
    val interrupted = new Thread(() => {
      results.add(StateEngine.oneSnapshotAtATime(() => true) { ran.set(true); Some(2) })
      flagged.set(Thread.currentThread().isInterrupted)
    })
    unwanted.start(); interrupted.start()
    Thread.sleep(100)
    assert(unwanted.isAlive && interrupted.isAlive, "a snapshot did not wait for the permit")
    wanted.set(false)
    interrupted.interrupt()
    unwanted.join(5000); interrupted.join(5000)
    assert(!unwanted.isAlive && !interrupted.isAlive, "a snapshot kept waiting")
    assert(results.toArray.toSeq == Seq(None, None) && !ran.get && flagged.get)
    release.countDown()
    holder.join()
    // The permit is free again: the next snapshot runs.
    assert(StateEngine.oneSnapshotAtATime(() => true)(Some(3)) == Some(3))
  }
}
