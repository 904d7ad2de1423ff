package heapstate

import java.nio.file.{Files, StandardCopyOption}

import scala.collection.mutable
import scala.util.Random

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state.{StateStore, StateStoreProvider}
import org.scalatest.funsuite.AnyFunSuite

import heapstate.StoreFixture._
import heapstate.io.{Codec, StateFileException, StateFiles}
import heapstate.io.StateFileNames.Journal

/**
 * A state rebuilt from a bucketed snapshot looks a key up in its bucket when the key is asked for
 * (copying out that key, or loading the bucket on a second look-up there), and loads the buckets a
 * share per commit. These tests look at states while they are still loading: through `get` and
 * `numKeys`, which load at most the buckets they need, and only now and then through the
 * iterator, which loads every bucket.
 */
class LazyLoadSuite extends AnyFunSuite {
  /** The smallest buckets: a few keys each, so that a small state has hundreds. */
  private val SmallBuckets = "spark.sql.streaming.stateStore.heapstate.snapshotBucketBytes" -> "64"
  private val Interval = "spark.sql.streaming.stateStore.heapstate.compactionInterval"

  private def pending(store: StateStore): Long =
    store.metrics.customMetrics(HeapStateStoreProvider.BucketsPending)

  /** Versions 1 to 8: 1,000 keys at version 1, a snapshot of version 5, then puts, updates and removes. */
  private def build(root: String, confs: Map[String, String]): Map[Long, Long] = {
    val p = provider(root, confs)
    var model = Map.empty[Long, Long]
    for (v <- 1 to 8) {
      val s = p.getStore(v - 1L, None, false, false)
      if (v == 1) (0 until 1000).foreach { k => put(s, k, k); model += k.toLong -> k.toLong }
      else {
        for (k <- (v * 37) until 1000 by 97) { put(s, k, k * 10L + v); model += k.toLong -> (k * 10L + v) }
        for (k <- (v * 11) until 1000 by 89) { remove(s, k); model -= k.toLong }
        put(s, 5000 + v, v); model += (5000L + v) -> v.toLong
      }
      s.commit()
      if (v == 5) p.doMaintenance()
    }
    p.close()
    assert(storeDir(root).list().contains("5.hs-snapshot"))
    model
  }

  test("a restart loads the buckets of the keys asked for, and the rest over the next commits") {
    val root = tempDir()
    val confs = Map(SmallBuckets, Interval -> "5")
    var model = build(root, confs)
    val p = provider(root, confs)
    var store = p.getStore(8, None, false, false)
    val total = pending(store)
    assert(total >= 512, s"a snapshot of 1,000 keys in 64-byte buckets has at least 512 buckets, not $total")
    assert(store.metrics.numKeys == model.size, "numKeys before any bucket is loaded")
    // Keys untouched since the snapshot, updated by a journal, removed by one, and added by one.
    for (k <- Seq(1L, 74L, 171L, 22L, 5006L, 4242L)) assert(get(store, k) == model.get(k), s"get($k)")
    assert(pending(store) >= total - 6, "six look-ups load at most six buckets")
    // The batch that rebuilt the state leaves loading to later commits.
    put(store, 3, -3); remove(store, 4); put(store, 7000, 7)
    model = model + (3L -> -3L) - 4L + (7000L -> 7L)
    assert(store.metrics.numKeys == model.size, "numKeys with the batch's changes")
    store.commit()
    store = p.getStore(9, None, false, false)
    assert(store.metrics.numKeys == model.size)
    assert(pending(store) >= total - 9)
    var version = 9L
    while (pending(store) > 0) {
      val before = pending(store)
      put(store, version, version * 3); model += version -> version * 3
      remove(store, 500 + version); model -= 500 + version
      store.commit(); version += 1
      store = p.getStore(version, None, false, false)
      assert(store.metrics.numKeys == model.size, s"numKeys at version $version")
      assert(pending(store) < before, "every commit loads a share")
      assert(version <= 9 + 8, s"still ${pending(store)} buckets to load at version $version")
    }
    assert(contents(store) == model)
  }

  test("a look-up copies one key out of a bucket not loaded; a second look-up there loads the bucket") {
    val root = tempDir()
    // 4 KiB buckets: the 1,000 keys of version 5 fall in 16 buckets, so look-ups share buckets.
    val confs = Map("spark.sql.streaming.stateStore.heapstate.snapshotBucketBytes" -> "4096", Interval -> "5")
    val at8 = build(root, confs)
    val p = provider(root, confs)
    var store = p.getStore(8, None, false, false)
    val total = pending(store)
    assert(total == 16, s"1,000 keys of about 41 bytes in 4 KiB buckets: 16 buckets, not $total")
    assert(get(store, 1) == at8.get(1L) && get(store, 4242) == None)
    // Asking again for a key the snapshot lacks (as a commit does after a get) is answered from
    // what the first look-up learnt. (Keys 1 and 4242 fall in different buckets.)
    assert(get(store, 4242) == None && get(store, 1) == at8.get(1L))
    assert(pending(store) == total, "first look-ups in a bucket, and the same keys again, load none")
    // 40 look-ups in 16 buckets: at least 24 are second ones, and load their bucket.
    for (k <- 100L until 140L) assert(get(store, k) == at8.get(k), s"get($k)")
    val afterReads = pending(store)
    assert(afterReads < total && afterReads > 0, s"$afterReads of $total buckets pending")
    // Changes to keys of buckets still pending: an update, a delete and an insert. None may be
    // undone when the buckets load, nor counted twice.
    val loadedNot = (0L until 1000L).filter(at8.contains).filterNot(k => k >= 100 && k < 140).take(300)
    val (upd, del) = (loadedNot(0), loadedNot(1))
    put(store, upd, -1); remove(store, del); put(store, 8888, 8)
    val at9 = at8 + (upd -> -1L) - del + (8888L -> 8L)
    store.commit()
    store = p.getStore(9, None, false, false)
    assert(store.metrics.numKeys == at9.size)
    assert(get(store, upd) == Some(-1L) && get(store, del) == None && get(store, 8888) == Some(8L))
    store.abort()
    // Stepping back restores the deleted key and drops the inserted one, buckets still pending.
    store = p.getStore(8, None, false, false)
    assert(pending(store) > 0)
    assert(store.metrics.numKeys == at8.size)
    assert(get(store, upd) == at8.get(upd) && get(store, del) == at8.get(del) && get(store, 8888) == None)
    assert(contents(store) == at8, "every bucket loaded over the keys looked up")
    store.abort()
    // Version 9 again, from files: the journal's delete holds as the buckets load.
    val fresh = provider(root, confs)
    val again = fresh.getStore(9, None, false, false)
    assert(get(again, upd) == Some(-1L))
    assert(contents(again) == at9)
  }

  test("a state still loading steps back through undo") {
    val root = tempDir()
    val confs = Map(SmallBuckets, Interval -> "5", "spark.sql.streaming.stateStore.heapstate.undoVersions" -> "3")
    val at8 = build(root, confs)
    val p = provider(root, confs)
    var store = p.getStore(8, None, false, false)
    put(store, 1, -1); remove(store, 2); put(store, 9000, 9); put(store, 9001, 9)
    val at9 = at8 + (1L -> -1L) - 2L + (9000L -> 9L) + (9001L -> 9L)
    store.commit()
    store = p.getStore(9, None, false, false)
    remove(store, 1); put(store, 9002, 9)
    val at10 = at9 - 1L + (9002L -> 9L)
    assert(at10.size != at8.size, "stepping back must change the key count")
    store.commit()
    store = p.getStore(10, None, false, false)
    assert(pending(store) > 0)
    assert(store.metrics.numKeys == at10.size)
    store.abort()
    store = p.getStore(8, None, false, false) // undo entries of 9 and 10 step back
    assert(store.metrics.numKeys == at8.size, "numKeys after stepping back")
    for (k <- Seq(1L, 2L, 9000L, 9002L, 74L)) assert(get(store, k) == at8.get(k), s"get($k) at version 8")
    assert(contents(store) == at8)
  }

  /**
   * The randomized model test of [[RandomizedModelSuite]], with states that stay partly loaded:
   * many restarts from files, small buckets, and checks by `get` and `numKeys`; the iterator (which
   * loads everything) only every 50th step.
   */
  test("random operations on states still loading match a Map model") {
    val seeds = sys.props.get("heapstate.seed").map(s => Seq(s.toLong)).getOrElse(Seq.fill(3)(Random.nextLong()))
    for (seed <- seeds) {
      info(s"seed $seed")
      try randomRun(seed, steps = 2000)
      catch { case e: Throwable => Console.err.println(s"LazyLoadSuite failed with seed $seed"); throw e }
    }
  }

  private def randomRun(seed: Long, steps: Int): Unit = {
    val rng = new Random(seed)
    val root = tempDir()
    val minRetain = 3 + rng.nextInt(5)
    val confs = Map(
      Interval -> (1 + rng.nextInt(4)).toString,
      "spark.sql.streaming.stateStore.heapstate.undoVersions" -> rng.nextInt(4).toString,
      "spark.sql.streaming.stateStore.heapstate.snapshotBucketBytes" -> Seq("64", "128", "512")(rng.nextInt(3)),
      "spark.sql.streaming.stateStore.heapstate.compressionCodec" -> Codec.all(rng.nextInt(Codec.all.size)).name
    )
    val keySpace = 500 + rng.nextInt(1500)
    var p: StateStoreProvider = provider(root, confs, minVersionsToRetain = minRetain)
    val committed = mutable.Map[Long, Map[Long, Long]](0L -> Map.empty)
    var floor = 0L
    var version = 0L
    var store: StateStore = p.getStore(0, None, false, false)
    var working = Map.empty[Long, Long]
    var sawPending = 0
    def open(v: Long): Unit = { store = p.getStore(v, None, false, false); version = v; working = committed(v) }
    for (step <- 1 to steps) {
      val roll = rng.nextInt(100)
      val what =
        if (roll < 40) {
          for (_ <- 0 until 1 + rng.nextInt(20)) {
            val k = rng.nextInt(keySpace).toLong; val v = rng.nextLong()
            put(store, k, v); working += k -> v
          }
          "puts"
        } else if (roll < 55) {
          for (_ <- 0 until 1 + rng.nextInt(10)) {
            val k = rng.nextInt(keySpace).toLong; remove(store, k); working -= k
          }
          "removes"
        } else if (roll < 72) {
          assert(store.commit() == version + 1)
          version += 1
          committed.keys.filter(_ >= version).foreach(committed.remove)
          committed(version) = working
          floor = math.max(floor, version - minRetain + 1)
          committed.keys.filter(_ < floor).foreach(committed.remove)
          open(version); "commit"
        } else if (roll < 76) {
          store.abort(); open(version); "abort"
        } else if (roll < 82) {
          val retained = committed.keys.toSeq.sorted
          store.abort(); open(retained(rng.nextInt(retained.size))); s"reload"
        } else if (roll < 94) {
          val retained = committed.keys.toSeq.sorted
          val target = if (rng.nextBoolean()) retained.last else retained(rng.nextInt(retained.size))
          store.abort(); p.close(); p = provider(root, confs, minVersionsToRetain = minRetain)
          open(target); s"new provider at $target"
        } else {
          store.abort()
          if (rng.nextBoolean()) p.doMaintenance() else { p.doSnapshotMaintenance(); p.doCleanupMaintenance() }
          open(version); "maintenance"
        }
      if (pending(store) > 0) sawPending += 1
      for (_ <- 0 until 3) {
        val k = rng.nextInt(keySpace).toLong
        assert(get(store, k) == working.get(k), s"seed $seed, step $step ($what), version $version: get($k)")
      }
      assert(store.metrics.numKeys == working.size, s"seed $seed, step $step ($what), version $version: numKeys")
      if (step % 50 == 0)
        assert(contents(store) == working, s"seed $seed, step $step ($what), version $version: contents")
    }
    assert(sawPending > steps / 20, s"seed $seed: only $sawPending steps saw a state still loading")
    val fresh = provider(root, confs, minVersionsToRetain = minRetain)
    for ((v, state) <- committed)
      assert(contents(fresh.getReadStore(v, None)) == state, s"seed $seed: fresh read of version $v")
  }

  /** The state of `tests/scala-resources/format1`, made by the format-1 heapstate: see `model1`. */
  private def format1Store(): String = {
    val root = tempDir()
    val dir = storeDir(root)
    dir.mkdirs()
    for (name <- Seq("1.hs-journal", "2.hs-journal", "3.hs-journal", "3.hs-snapshot", "4.hs-journal", "5.hs-journal")) {
      val in = getClass.getResourceAsStream(s"/format1/$name")
      try Files.copy(in, new java.io.File(dir, name).toPath, StandardCopyOption.REPLACE_EXISTING)
      finally in.close()
    }
    root
  }

  /** What the format-1 files hold: at version v, every key k < 40 with (k + v) % 3 == 0 is put (k * 100 + v), then those with (k * v) % 7 == 1 removed. */
  private def model1(version: Int): Map[Long, Long] = {
    var m = Map.empty[Long, Long]
    for (v <- 1 to version; k <- 0 until 40) {
      if ((k + v) % 3 == 0) m += k.toLong -> (k * 100L + v)
      if ((k * v) % 7 == 1) m -= k.toLong
    }
    m
  }

  test("format-1 checkpoints load, and take format-2 files on top") {
    val root = format1Store()
    val confs = Map(SmallBuckets, Interval -> "3")
    var p = provider(root, confs)
    var store = p.getStore(5, None, false, false)
    assert(store.metrics.numKeys == model1(5).size)
    assert(contents(store) == model1(5))
    put(store, 100, 1); remove(store, 3)
    val at6 = model1(5) + (100L -> 1L) - 3L
    store.commit()
    p.close()
    // Snapshot 3 and journals 4 and 5 of format 1, journal 6 of format 2.
    p = provider(root, confs)
    store = p.getStore(6, None, false, false)
    assert(store.metrics.numKeys == at6.size)
    assert(get(store, 100) == Some(1L) && get(store, 3) == None)
    assert(contents(store) == at6)
    store.abort()
    p.doMaintenance() // a format-2 snapshot of version 6
    p.close()
    p = provider(root, confs)
    store = p.getStore(6, None, false, false)
    assert(pending(store) > 0, "a format-2 snapshot loads lazily")
    assert(store.metrics.numKeys == at6.size)
    assert(contents(store) == at6)
  }

  test("a format-1 journal above a bucketed snapshot loads the snapshot whole, counting the keys it finds") {
    // A format-1 heapstate (after a downgrade) can write journals above a format-2 snapshot: they
    // record no key delta.
    val root = format1Store()
    val dir = storeDir(root)
    val aside = StoreFixture.tempPath("format1-journal").resolve("5.hs-journal")
    Files.move(new java.io.File(dir, "5.hs-journal").toPath, aside)
    val confs = Map(SmallBuckets, Interval -> "1")
    var p = provider(root, confs)
    p.getStore(4, None, false, false).abort()
    p.doMaintenance() // a format-2 snapshot of version 4, from format-1 snapshot 3 and journal 4
    p.close()
    assert(dir.list().contains("4.hs-snapshot"))
    Files.move(aside, new java.io.File(dir, "5.hs-journal").toPath)
    assert(model1(5).size != model1(4).size, "the format-1 journal must change the key count")
    p = provider(root, confs)
    val store = p.getStore(5, None, false, false)
    assert(pending(store) == 0, "a journal without a key delta loads every bucket")
    assert(store.metrics.numKeys == model1(5).size)
    assert(contents(store) == model1(5))
  }

  test("journals whose key counts do not add up are an error naming the snapshot, not a wrong count") {
    val root = tempDir()
    val confs = Map(SmallBuckets, Interval -> "5")
    val model = build(root, confs)
    // Journal 8 written again with the same records but a key delta one too high.
    val files = new StateFiles(new Path(storeDir(root).getPath), new Configuration(), 0)
    val journal8 = files.list().find(f => f.kind == Journal && f.version == 8).get
    val records = mutable.ArrayBuffer.empty[Either[Array[Byte], (Array[Byte], Array[Byte])]]
    val delta = files.read(journal8)((k, v) => records += Right((k, v)), k => records += Left(k)).keyDelta.get
    files.writeJournal(8, Codec.Zstd, None, None) { w =>
      records.foreach(_.fold(w.delete, kv => w.put(kv._1, kv._2)))
      delta + 1
    }
    val p = provider(root, confs)
    val store = p.getStore(8, None, false, false)
    assert(store.metrics.numKeys == model.size + 1) // what the counts say, until every bucket is in
    val e = intercept[StateFileException](contents(store))
    assert(e.getMessage.contains("5.hs-snapshot") && e.getMessage.contains("key counts"), e.getMessage)
    // The state stays unusable rather than serving keys under a wrong count.
    intercept[StateFileException]((0 until 1000).foreach(k => get(store, k)))
  }

  test("a prefix scan after a restart sees the keys of buckets not loaded yet") {
    val root = tempDir()
    val confs = Map(SmallBuckets, Interval -> "2")
    var p = provider(root, confs, prefixScan = true)
    for (v <- 1 to 3) {
      val s = p.getStore(v - 1L, None, false, false)
      for (g <- 0 until 50; t <- 0 until 4)
        s.put(prefixKey(s"g$g", t * 10L + v), row(g * 100L + t), StateStore.DEFAULT_COL_FAMILY_NAME)
      s.commit()
      if (v == 2) p.doMaintenance()
    }
    p.close()
    p = provider(root, confs, prefixScan = true)
    val store = p.getStore(3, None, false, false)
    assert(pending(store) > 0)
    val it = store.prefixScan(prefix("g7"), StateStore.DEFAULT_COL_FAMILY_NAME)
    val seen = mutable.Set.empty[(Long, Long)]
    while (it.hasNext) { val pair = it.next(); seen += ((pair.key.getLong(1), pair.value.getLong(0))) }
    assert(seen == (for (t <- 0 until 4; v <- 1 to 3) yield (t * 10L + v, 700L + t)).toSet)
  }
}
