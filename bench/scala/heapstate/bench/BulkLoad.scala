package heapstate.bench

import java.nio.file.Files

import heapstate.bench.BenchStores._

/**
 * One version that inserts K new keys into an empty store (a query's first batch, or a backfill),
 * through the `StateStore` API, with the providers taking turns in one JVM: the time of the puts
 * and of the commit, medians over rounds after warm-ups. W3 measures the same load once, in a
 * JVM that has run nothing yet; this repeats it, so that the JIT's first compilations are not
 * most of the figure.
 *
 * {{{
 *   bin/sbt "bench/runMain heapstate.bench.BulkLoad --keys 1000000 --rounds 7 --providers hdfs,heapstate"
 * }}}
 */
object BulkLoad {
  def main(args: Array[String]): Unit = {
    val opts = options(args)
    val keys = opts.getOrElse("keys", "1000000").toInt
    val rounds = opts.getOrElse("rounds", "7").toInt
    val warmups = opts.getOrElse("warmups", "2").toInt
    require(keys >= 1 && rounds >= 1 && warmups >= 0, "--keys and --rounds at least 1, --warmups at least 0")
    val providers = chosen(opts + ("providers" -> opts.getOrElse("providers", "hdfs,heapstate")))
    val times = providers.map(p => p.name -> scala.collection.mutable.ArrayBuffer.empty[(Double, Double)]).toMap
    for (round <- 1 to warmups + rounds; p <- providers) {
      val (puts, commit) = loadOnce(p, keys)
      println(f"[bulk] ${p.name}%-18s round $round%2d${if (round <= warmups) " (warm-up)" else ""}%s: " +
        f"puts $puts%8.1f ms, commit $commit%8.1f ms")
      if (round > warmups) times(p.name) += ((puts, commit))
    }
    val base = providers.head.name
    def med(name: String, f: ((Double, Double)) => Double): Double = median(times(name).map(f).toSeq)
    println(f"\nBulk load of $keys%,d new keys in one version, medians of $rounds rounds (ratios to $base)")
    println(f"${"provider"}%-18s ${"puts ms"}%16s ${"commit ms"}%16s ${"total ms"}%16s")
    for (p <- providers) {
      val cells = Seq[((Double, Double)) => Double](_._1, _._2, t => t._1 + t._2).map { f =>
        val v = med(p.name, f)
        f"$v%8.1f (${v / med(base, f)}%.2fx)"
      }
      println(f"${p.name}%-18s ${cells(0)}%16s ${cells(1)}%16s ${cells(2)}%16s")
    }
  }

  /** Loads `keys` keys as version 1 of a fresh store; returns the ms of the puts and of the commit. */
  private def loadOnce(p: Provider, keys: Int): (Double, Double) = {
    val root = Files.createTempDirectory(s"bulk-${p.name}")
    val provider = open(p, root.toString)
    try {
      val key = longRow()
      val value = longRow()
      val t0 = System.nanoTime()
      val store = provider.getStore(0)
      var i = 0
      while (i < keys) { key.setLong(0, i); value.setLong(0, i * 3L); store.put(key, value); i += 1 }
      val t1 = System.nanoTime()
      store.commit()
      val t2 = System.nanoTime()
      ((t1 - t0) / 1e6, (t2 - t1) / 1e6)
    } finally {
      provider.close()
      deleteRecursively(root.toFile)
    }
  }
}
