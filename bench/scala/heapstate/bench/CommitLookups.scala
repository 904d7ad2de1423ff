package heapstate.bench

import java.lang.management.ManagementFactory

import heapstate.engine.{ChangeSet, Entry, Key}

/**
 * A commit's table work as W5's key counts grow. `--stores` live states of `--keys` keys each (W5
 * at K = 1M and 4M: four stores of 250,000 and of 1M keys) take turns, as a batch's tasks do.
 * Each version of a store reads `--updates` random keys (as Spark's restore does), reads
 * `--churn` random words of `--other-mb` MB of other memory (the rest of a task's work, which
 * evicts those reads from the caches and the TLB), puts a new value of the same length for each
 * key, and then prepares and applies the commit; only that last step is timed, in its thread's
 * CPU time.
 * {{{
 *   bin/sbt "bench/runMain heapstate.bench.CommitLookups"
 *   bin/sbt "bench/runMain heapstate.bench.CommitLookups --keys 250000,1000000 --versions 80"
 *   bin/sbt 'set bench / run / javaOptions += "-XX:+UseTransparentHugePages"' "bench/runMain heapstate.bench.CommitLookups"
 * }}}
 * No journal is written: the file and its compression do not grow with the keys (see README).
 */
object CommitLookups {
  def main(args: Array[String]): Unit = {
    val opts = BenchStores.options(args)
    val sizes = opts.getOrElse("keys", "250000,1000000").split(",").map(_.trim.toInt).toSeq
    val storeCount = opts.getOrElse("stores", "4").toInt
    val updates = opts.getOrElse("updates", "2500").toInt
    val versions = opts.getOrElse("versions", "60").toInt
    val valueBytes = opts.getOrElse("value-bytes", OneStore.W5ValueBytes.toString).toInt
    val threads = ManagementFactory.getThreadMXBean
    // Read at random between a store's reads and its commit: the rest of a task's work, which
    // leaves little of those reads in the caches and the TLB.
    val other = new Array[Long](opts.getOrElse("other-mb", "256").toInt << 17)
    val churn = opts.getOrElse("churn", "200000").toInt
    val otherRnd = new java.util.Random(3)
    var sink = 0L
    val results = sizes.map { keys =>
      val stores = (1 to storeCount).map(_ => new OneStore(keys, valueBytes))
      System.gc()
      val times = scala.collection.mutable.ArrayBuffer.empty[Double]
      for (v <- 1 to versions; store <- stores) {
        val live = store.live
        val chosen = scala.collection.mutable.LinkedHashSet.empty[Int]
        while (chosen.size < updates) chosen += store.rnd.nextInt(keys)
        val ks = chosen.toArray.map(k => Key(store.keyBytes(k)))
        ks.foreach(k => sink += live.get(k))
        var i = 0
        while (i < churn) { sink += other(otherRnd.nextInt(other.length)); i += 1 }
        val changes = new ChangeSet(live)
        ks.foreach(k => changes.put(k, Entry(k.bytes, store.value())))
        val started = threads.getCurrentThreadCpuTime
        live.applyCommit(live.prepareCommit(changes), live.version - 1, inPlace = true)
        if (v > versions / 4)
          times += (threads.getCurrentThreadCpuTime - started) / 1e6 // the first quarter warms the JIT up
        changes.release()
      }
      keys -> BenchStores.median(times.toSeq)
    }
    val jvmOptions = ManagementFactory.getRuntimeMXBean.getInputArguments.toArray.mkString(" ")
    println(s"prepare + apply of $updates updates, CPU ms a commit (median), $storeCount stores taking turns, " +
      s"$versions versions each (the first quarter not counted); JVM options: $jvmOptions")
    results.foreach { case (keys, ms) => println(f"$keys%12d keys a store: $ms%.3f ms") }
    if (results.size >= 2)
      println(f"growth, ${results.last._1} keys over ${results.head._1}: ${results.last._2 / results.head._2}%.2fx")
    require(sink != 42) // keeps the reads
  }
}
