package heapstate.bench

/**
 * What a commit costs in the live table, alone: one partition of W1 (`--keys` keys, a 16-byte
 * key row and a value row of W1's size), then `--commits` commits of `--updates` random updates
 * each, timed (look-ups, undo records, the table's changes and its compaction). Prints the median
 * and slowest commit over the second half, the bytes compaction moved per commit, and the heap
 * (`memoryBytes`, and the JVM's after a full GC) against the live entries. Run it in a JVM of
 * its own (`bin/sbt` forks one). Every update keeps its value's length, so the commits write
 * updates in place, as the store's do while none of its snapshots is being written; `--in-place
 * false` appends them instead, as while one is; `--append A/P` appends in the first A of every P
 * commits (a snapshot overlapping A of P versions) and also prints the median commit at each
 * position of the P.
 * {{{
 *   bin/sbt "bench/runMain heapstate.bench.ArenaChurn"
 *   bin/sbt "bench/runMain heapstate.bench.ArenaChurn --in-place false"
 *   bin/sbt "bench/runMain heapstate.bench.ArenaChurn --append 3/10 --commits 400"
 *   bin/sbt "bench/runMain heapstate.bench.ArenaChurn --keys 1000000 --updates 2500 --commits 200"
 * }}}
 */
object ArenaChurn {
  def main(args: Array[String]): Unit = {
    val opts = BenchStores.options(args)
    val store = OneStore(opts, defaultValueBytes = OneStore.W1ValueBytes)
    import store.{keys, live, valueBytes}
    val updates = opts.getOrElse("updates", "2500").toInt
    val commits = opts.getOrElse("commits", "200").toInt
    val undoVersions = opts.getOrElse("undo-versions", "3").toInt
    val inPlace = opts.getOrElse("in-place", "true").toBoolean
    // `--append A/P`: of every P commits, the first A append, as while a snapshot is written
    val (appendRun, appendPeriod) = opts.get("append").map { given =>
      given.split("/").map(_.toIntOption) match {
        case Array(Some(a), Some(p)) if p >= 1 && a >= 0 && a <= p && commits >= 2 * p => (a, p)
        case _ => sys.error(
            s"--append $given: give A/P with 0 <= A <= P and P at most half of --commits ($commits), such as 3/10")
      }
    }.getOrElse((if (inPlace) 0 else 1, 1))
    val micros = new Array[Long](commits)
    val moved = new Array[Long](commits)
    for (c <- 0 until commits) {
      val changes = store.randomChanges(updates)
      val movedBefore = live.compactedBytes
      val started = System.nanoTime()
      live.applyCommit(live.prepareCommit(changes), live.version + 1 - undoVersions, c % appendPeriod >= appendRun)
      micros(c) = (System.nanoTime() - started) / 1000
      moved(c) = live.compactedBytes - movedBefore
    }
    val tail = micros.drop(commits / 2).sorted
    val entryBytes = keys.toLong * (8 + 16 + valueBytes)
    println(f"keys $keys%,d, updates $updates%,d a commit, $commits%,d commits, " +
      (if (appendRun < appendPeriod) s"${live.writtenInPlace} updates written in place" else "updates appended"))
    println(f"commit (second half): median ${tail(tail.length / 2) / 1000.0}%.2f ms, max ${tail.last / 1000.0}%.2f ms")
    if (appendPeriod > 1) {
      val byPosition = (0 until appendPeriod).map { k =>
        val at = (commits / 2 until commits).filter(_ % appendPeriod == k).map(micros(_)).sorted
        f"${at(at.length / 2) / 1000.0}%.2f"
      }
      println(
        s"commit (second half) by position in each $appendPeriod, medians in ms, the first $appendRun appending: ${byPosition.mkString(" ")}")
    }
    println(
      f"moved by compaction (second half): ${moved.drop(commits / 2).sum.toDouble / (commits - commits / 2) / 1e6}%.2f MB a commit")
    System.gc(); System.gc()
    val heapUsed = java.lang.management.ManagementFactory.getMemoryMXBean.getHeapMemoryUsage.getUsed
    println(
      f"page size ${heapstate.engine.EntryTable.PageBytes}%,d bytes; heap used after a full GC ${heapUsed / 1e6}%.1f MB")
    println(
      f"memoryBytes ${live.memoryBytes / 1e6}%.1f MB for $entryBytes%,d bytes of entries (${live.memoryBytes.toDouble / entryBytes}%.3fx)")
  }
}
