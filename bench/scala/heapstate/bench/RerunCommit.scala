package heapstate.bench

/**
 * What a re-run version's commit costs on the local disk: checkpoint format 1 commits a retried
 * batch's version again, and its journal replaces the earlier file. Each provider commits
 * versions 1 to 10 of `--keys` keys, then `--reruns` times commits version 11 again from version
 * 10 (`--puts` puts each, different values each time), then as many new versions after it. A
 * re-run's time includes its `getStore`, which takes the store back from version 11 to 10 (as a
 * retried task does), besides the puts and the commit; so does a new version's, without going
 * back. It prints the median wall time of a version of each kind and the processes forked per
 * version (the `processes` line of `/proc/stat`, which counts the whole machine's, so run it on
 * an idle machine).
 * {{{
 *   bin/sbt "bench/runMain heapstate.bench.RerunCommit"
 *   bin/sbt "bench/runMain heapstate.bench.RerunCommit --providers hdfs,heapstate --reruns 400"
 * }}}
 */
object RerunCommit {
  def main(args: Array[String]): Unit = {
    val opts = BenchStores.options(args)
    val keys = opts.getOrElse("keys", "10000").toInt
    val puts = opts.getOrElse("puts", "100").toInt
    val reruns = opts.getOrElse("reruns", "200").toInt
    val providers = BenchStores.chosen(opts + ("providers" -> opts.getOrElse("providers", "hdfs,heapstate")))
    val row = BenchStores.longRow()
    val value = BenchStores.longRow()
    def forked(): Long =
      java.nio.file.Files.readAllLines(java.nio.file.Paths.get("/proc/stat")).toArray.map(_.toString)
        .find(_.startsWith("processes ")).map(_.split(" ")(1).toLong).getOrElse(-1L)
    println(f"${"provider"}%-18s ${"kind"}%-12s ${"median ms"}%10s ${"forks each"}%11s")
    for (p <- providers) {
      val root = java.nio.file.Files.createTempDirectory("rerun-").toFile
      try {
        val provider = BenchStores.open(p, root.getPath)
        def commit(from: Long, salt: Long, n: Int): Unit = {
          val store = provider.getStore(from)
          for (i <- 0 until n) {
            row.setLong(0, i.toLong); value.setLong(0, salt * 1000003L + i)
            store.put(row, value)
          }
          store.commit()
        }
        commit(0, 0, keys)
        (1L until 10L).foreach(v => commit(v, v, puts))
        def measure(kind: String, times: Int)(one: Int => Unit): Unit = {
          val before = forked()
          val ms = (0 until times).map { i =>
            val t0 = System.nanoTime(); one(i); (System.nanoTime() - t0) / 1e6
          }
          val forks = (forked() - before).toDouble / times
          println(f"${p.name}%-18s $kind%-12s ${BenchStores.median(ms)}%10.2f $forks%11.2f")
        }
        (0 until 20).foreach(i => commit(10, 100 + i, puts)) // warm-up, not counted
        measure("re-run", reruns)(i => commit(10, 1000 + i, puts))
        measure("new version", reruns)(i => commit(11 + i, 5000 + i, puts))
        provider.close()
      } finally BenchStores.deleteRecursively(root)
    }
  }
}
