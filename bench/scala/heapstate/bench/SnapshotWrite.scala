package heapstate.bench

import heapstate.bench.BenchStores._

import java.nio.file.Files

/**
 * How much work one heapstate snapshot of a W1 store is: the CPU time that a background snapshot
 * spreads over the batches it overlaps (paced to a third of a core, it lasts at least three times
 * as long). One store of `--keys` keys shaped as [[RestartLoad]]'s (W1's 1M keys in 4 partitions
 * make 250,000 a store), in this JVM; then `--runs` rounds of `--interval` versions (2 by
 * default) of 2,500 updates each, all committed plainly but the last, which is committed with
 * `forceSnapshotOnCommit` and writes the snapshot unpaced inside the commit. Prints each commit's
 * time, and the median of the forced ones minus the median of the plain ones: the snapshot.
 * Every snapshot copies the buckets no update touched since the one before it, so `--interval 10`
 * is W1's share of changed keys (a tenth): the first commit, of every key, is a bulk load, whose
 * snapshot (compressed whole, not timed) the commit writes (`StateEngine.BulkLoadSnapshotBytes`).
 * With `--keys` small enough for a state under 4 MiB, the first forced snapshot has nothing to
 * copy from.
 *
 * `--off-local true` names Spark's FileContext-based checkpoint manager, under which the store
 * takes its directory for one off the local disk (HDFS, an object store) and copies buckets from
 * local copies of its snapshots.
 *
 * `--updates` (2,500) keys change in each version, with values of `--payload` (256) hex characters.
 * One of W5's four stores at K=4M is `--keys 1000000 --updates 2500 --payload 64 --interval 10`
 * (`--keys 250000` at 1M).
 * {{{
 *   bin/sbt "bench/runMain heapstate.bench.SnapshotWrite"
 *   bin/sbt "bench/runMain heapstate.bench.SnapshotWrite --keys 250000 --runs 5 --interval 10"
 *   bin/sbt "bench/runMain heapstate.bench.SnapshotWrite --bucket-bytes 32768"
 *   bin/sbt "bench/runMain heapstate.bench.SnapshotWrite --codec none"
 *   bin/sbt "bench/runMain heapstate.bench.SnapshotWrite --off-local true"
 * }}}
 */
object SnapshotWrite {
  /**
   * Spark's FileContext-based checkpoint manager (its default for HDFS and the object stores):
   * named, it makes the store treat its directory as off the local disk while the files stay on
   * this one.
   */
  val OffLocalManager = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"

  def main(args: Array[String]): Unit = {
    val opts = options(args)
    val keys = opts.getOrElse("keys", "250000").toInt
    val runs = opts.getOrElse("runs", "5").toInt
    val interval = opts.getOrElse("interval", "2").toInt
    require(interval >= 2, "--interval must be at least 2: a plain commit between snapshots")
    val updates = opts.getOrElse("updates", "2500").toInt
    val payload = opts.getOrElse("payload", "256").toInt
    val root = Files.createTempDirectory("snapshot-write")
    val base = Providers.find(_.name == "heapstate").get
    val confs = opts.get("bucket-bytes").map(heapstate.HeapStateConf.SnapshotBucketBytes.key -> _) ++
      opts.get("codec").map(heapstate.HeapStateConf.CompressionCodec.key -> _) ++
      opts.get("off-local").filter(_ != "false").map(_ =>
        heapstate.io.StateFiles.FileManagerClassKey -> OffLocalManager)
    val p = base.copy(confs = base.confs ++ confs)
    val provider = RestartLoad.open(p, root.toString, 0)
    try {
      val first = provider.getStore(0)
      for (k <- 0 until keys) first.put(RestartLoad.key(k), RestartLoad.value(k, 0, payload))
      first.commit()
      val rnd = new java.util.Random(1)
      val plain, forced = Seq.newBuilder[Double]
      val sizes = Seq.newBuilder[Long]
      for (v <- 1 to interval * runs) {
        val force = v % interval == 0
        val store = provider.getStore(v.toLong, None, forceSnapshotOnCommit = force, loadEmpty = false)
        for (_ <- 0 until updates) {
          val k = rnd.nextInt(keys).toLong; store.put(RestartLoad.key(k), RestartLoad.value(k, v, payload))
        }
        val started = System.nanoTime()
        store.commit()
        val ms = (System.nanoTime() - started) / 1e6
        (if (force) forced else plain) += ms
        if (force) sizes += newestSnapshotBytes(root)
        println(f"version ${v + 1}: commit ${if (force) "with a snapshot" else "alone"} $ms%.2f ms")
      }
      val (a, s) = (median(plain.result()), median(forced.result()))
      println(f"%nSnapshot of $keys%,d keys: commit with it $s%.2f ms, alone $a%.2f ms (medians of $runs): " +
        f"the snapshot ${s - a}%.2f ms; its file ${median(sizes.result().map(_.toDouble)) / 1e6}%.2f MB")
    } finally {
      provider.close()
      deleteRecursively(root.toFile)
    }
  }

  /** The bytes of the newest snapshot file under `root` (the store's directory is below it). */
  private def newestSnapshotBytes(root: java.nio.file.Path): Long = {
    val files = Files.walk(root)
    try {
      val snapshots = files.filter(_.toString.endsWith(".hs-snapshot")).toArray.map(_.asInstanceOf[java.nio.file.Path])
      val newest = snapshots.maxBy(f => f.getFileName.toString.takeWhile(_.isDigit).toLong)
      Files.size(newest)
    } finally files.close()
  }
}
