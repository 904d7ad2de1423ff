package heapstate.bench

import java.lang.management.ManagementFactory

import heapstate.engine.{ChangeSet, Entry, Key, MemoryModel}

/**
 * The heap an undo log holds, measured: one partition of W1 (`--keys` keys, a 16-byte key row
 * and a value row of W1's size), then `--versions` commits of `--updates` random updates each,
 * with every undo entry kept, as while a snapshot of the first of them is being written. The heap
 * used after a full GC is taken with the undo log and again after dropping it; the difference,
 * less the prior entries the log keeps alive (which any undo log must), is what the records
 * themselves cost. It also prints what `memoryUsedBytes` counts for them.
 * {{{
 *   bin/sbt "bench/runMain heapstate.bench.UndoHeap"
 *   bin/sbt "bench/runMain heapstate.bench.UndoHeap --keys 250000 --updates 2500 --versions 10"
 * }}}
 * Run it in a JVM of its own (`bin/sbt` forks one): other live objects would blur the figure.
 */
object UndoHeap {
  def main(args: Array[String]): Unit = {
    val opts = BenchStores.options(args)
    val store = OneStore(opts, defaultValueBytes = OneStore.W1ValueBytes)
    import store.{keyBytes, keys, live, rnd, value}
    val updates = opts.getOrElse("updates", "2500").toInt
    val versions = opts.getOrElse("versions", "10").toInt
    var priorBytes = 0L
    for (v <- 2 to versions + 1) {
      val changes = new ChangeSet(live)
      val chosen = scala.collection.mutable.HashSet.empty[Int]
      while (chosen.size < updates) chosen += rnd.nextInt(keys)
      chosen.foreach { k =>
        val key = Key(keyBytes(k))
        val prior = live.get(key)
        val page = live.pageOf(prior)
        val at = live.offsetOf(prior)
        // The copy the undo log will keep.
        priorBytes += MemoryModel.liveEntry(page.slice(at, at + Entry.length(page, at)))
        changes.put(key, Entry(key.bytes, value()))
      }
      live.applyCommit(live.prepareCommit(changes), 1, inPlace = true) // keeps every undo entry above version 1
    }
    val counted = live.memoryBytes
    val withUndo = usedAfterGc()
    live.dropUndoUpTo(live.version)
    val without = usedAfterGc()
    val records = versions.toLong * updates
    val recordBytes = withUndo - without - priorBytes
    println(f"keys $keys, $versions versions of $updates updates kept: $records undo records")
    println(
      f"heap with the undo log ${withUndo / 1e6}%.1f MB, without ${without / 1e6}%.1f MB; prior entries ${priorBytes / 1e6}%.1f MB")
    println(f"the records themselves: ${recordBytes / 1e6}%.2f MB, ${recordBytes.toDouble / records}%.1f B per record")
    println(f"memoryUsedBytes counted for the undo log: ${(counted - live.memoryBytes) / 1e6}%.2f MB " +
      f"(${(counted - live.memoryBytes - priorBytes).toDouble / records}%.1f B per record beyond the prior entries)")
    // Keep `live` reachable to here, so that the second measurement still holds the state.
    require(live.numKeys == keys)
  }

  private def usedAfterGc(): Long = {
    val bean = ManagementFactory.getMemoryMXBean
    (1 to 3).foreach { _ => System.gc(); Thread.sleep(200) }
    bean.getHeapMemoryUsage.getUsed
  }
}
