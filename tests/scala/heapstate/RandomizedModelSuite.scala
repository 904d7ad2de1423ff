package heapstate

import scala.collection.mutable
import scala.util.Random

import org.apache.spark.sql.execution.streaming.state.StateStore
import org.scalatest.funsuite.AnyFunSuite

import heapstate.StoreFixture._

/**
 * Thousands of random steps against a plain Map model: put, remove, commit, abort, reload at a
 * random retained version (same provider, or a fresh one as after an executor loss), maintenance
 * (snapshot and cleanup). After every step the store's contents must equal the model's.
 * A failure prints the seed; rerun it with -Dheapstate.seed=<seed>.
 */
class RandomizedModelSuite extends AnyFunSuite {
  private val steps = sys.props.get("heapstate.steps").map(_.toInt).getOrElse(3000)

  /**
   * `pagesFrom`: the providers' change sets move puts to pages from this many changes, when their
   * batch began on an empty state (`ChangeSet`'s "Large first batches"); None keeps the default.
   * `offLocal`: the stores take their directory for one off the local disk (Spark's
   * FileContext-based checkpoint manager named, its default for HDFS and object stores), with
   * 64-byte snapshot buckets; returns how many buckets their snapshots copied.
   */
  private def runOne(seed: Long, pagesFrom: Option[Int] = None, offLocal: Boolean = false): Long = {
    val rng = new Random(seed)
    def provider(root: String, confs: Map[String, String], minVersionsToRetain: Int): HeapStateStoreProvider = {
      val p = StoreFixture.provider(root, confs, minVersionsToRetain = minVersionsToRetain)
      pagesFrom.foreach(n => p.changeSetPagesFrom = n)
      p
    }
    val root = tempDir()
    val minRetain = 1 + rng.nextInt(7)
    val confs = Map(
      "spark.sql.streaming.stateStore.heapstate.compactionInterval" -> (1 + rng.nextInt(5)).toString,
      "spark.sql.streaming.stateStore.heapstate.undoVersions" -> rng.nextInt(4).toString,
      "spark.sql.streaming.stateStore.heapstate.compressionCodec" -> Seq("zstd", "lz4", "snappy", "none")(
        rng.nextInt(4))
    ) ++ (if (!offLocal) Map.empty
          else Map(
            heapstate.io.StateFiles.FileManagerClassKey ->
              StoreFixture.FileContextManager,
            "spark.sql.streaming.stateStore.heapstate.snapshotBucketBytes" -> "64"
          ))
    val keySpace = 20 + rng.nextInt(300)
    var p = provider(root, confs, minVersionsToRetain = minRetain)
    var copied = 0L // by the providers closed so far
    // committed(v) = the state at version v of the current lineage
    val committed = mutable.Map[Long, Map[Long, Long]](0L -> Map.empty)
    var latest = 0L
    // Versions below this may have been cleaned up: retention follows the highest version reached,
    // and a re-run of an older batch does not bring back what cleanup already removed.
    var floor = 0L
    var version = 0L
    var store: StateStore = p.getStore(0, None, false, false)
    var working = Map.empty[Long, Long]
    def check(step: Int, what: String): Unit = {
      val actual = contents(store)
      if (actual != working) {
        val missing = working.keySet -- actual.keySet
        val extra = actual.keySet -- working.keySet
        val wrong = working.keySet.intersect(actual.keySet).filter(k => working(k) != actual(k))
        fail(s"seed $seed, step $step ($what), version $version: store differs from the model: " +
          s"missing ${missing.take(5)}, extra ${extra.take(5)}, wrong values ${wrong.take(5)}")
      }
      val k = rng.nextInt(keySpace).toLong
      assert(get(store, k) == working.get(k), s"seed $seed, step $step ($what): get($k)")
      assert(store.metrics.numKeys == working.size, s"seed $seed, step $step ($what): numKeys")
      val (counted, recounted) = p.memoryAccounts
      assert(counted == recounted, s"seed $seed, step $step ($what): the live state's running memory count")
    }
    def open(v: Long): Unit = {
      store = p.getStore(v, None, false, false); version = v; working = committed(v)
    }
    for (step <- 1 to steps) {
      val roll = rng.nextInt(100)
      val what =
        if (roll < 45) {
          val k = rng.nextInt(keySpace).toLong; val v = rng.nextLong()
          put(store, k, v); working += k -> v; "put"
        } else if (roll < 62) {
          val k = rng.nextInt(keySpace).toLong
          remove(store, k); working -= k; "remove"
        } else if (roll < 74) {
          assert(store.commit() == version + 1)
          version += 1
          // A commit below `latest` (after a reload) abandons the versions above it.
          committed.keys.filter(_ >= version).foreach(committed.remove)
          committed(version) = working
          latest = version
          // The newest minRetain versions, and the one before the live one whatever minRetain is.
          floor = math.max(floor, math.min(latest - minRetain + 1, latest - 1))
          committed.keys.filter(_ < floor).foreach(committed.remove)
          open(version); "commit"
        } else if (roll < 78) {
          store.abort(); open(version); "abort"
        } else if (roll < 88) {
          val retained = committed.keys.toSeq.sorted
          val target = retained(rng.nextInt(retained.size))
          store.abort(); open(target); s"reload $target"
        } else if (roll < 91) {
          val retained = committed.keys.toSeq.sorted
          val target = retained(rng.nextInt(retained.size))
          store.abort(); copied += p.snapshotBucketsCopied; p.close()
          p = provider(root, confs, minVersionsToRetain = minRetain)
          open(target); s"new provider at $target"
        } else {
          store.abort()
          if (rng.nextBoolean()) p.doMaintenance() else { p.doSnapshotMaintenance(); p.doCleanupMaintenance() }
          open(version); "maintenance"
        }
      check(step, what)
    }
    // In the end every retained version, read by a fresh provider, equals the model.
    val fresh = provider(root, confs, minVersionsToRetain = minRetain)
    for ((v, state) <- committed) {
      assert(contents(fresh.getReadStore(v, None)) == state, s"seed $seed: fresh read of version $v")
    }
    val total = copied + p.snapshotBucketsCopied
    store.abort(); p.close(); fresh.close()
    total
  }

  private def seeds: Seq[Long] =
    sys.props.get("heapstate.seed").map(s => Seq(s.toLong)).getOrElse(Seq.fill(3)(Random.nextLong()))

  test(s"random operations match a Map model ($steps steps per seed)") {
    for (seed <- seeds) {
      info(s"seed $seed")
      try runOne(seed)
      catch { case e: Throwable => Console.err.println(s"RandomizedModelSuite failed with seed $seed"); throw e }
    }
  }

  test(
    s"random operations match a Map model off the local disk, snapshots copying from local copies ($steps steps per seed)") {
    var copied = 0L
    for (seed <- seeds) {
      try {
        val n = runOne(seed, offLocal = true)
        info(s"seed $seed: $n buckets copied")
        copied += n
      } catch {
        case e: Throwable => Console.err.println(s"RandomizedModelSuite (off local) failed with seed $seed"); throw e
      }
    }
    assert(copied > 0, "no snapshot copied a bucket from a local copy: the test did not test that")
  }

  test(s"random operations match a Map model, puts moved to pages from 1 to 4 changes ($steps steps per seed)") {
    for (seed <- seeds) {
      val pagesFrom = 1 + (seed & 3).toInt
      info(s"seed $seed, pages from $pagesFrom changes")
      try runOne(seed, Some(pagesFrom))
      catch {
        case e: Throwable => Console.err.println(s"RandomizedModelSuite (paged) failed with seed $seed"); throw e
      }
    }
  }
}
