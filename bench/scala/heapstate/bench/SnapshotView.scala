package heapstate.bench

import heapstate.engine.LiveState

/**
 * What a snapshot view costs as commits pile up above its version: one W1 store (`--keys` keys,
 * W1's value rows), then the view of version 1 ([[LiveState.writeSnapshotView]], with a visitor
 * that only sums the hashes: no bucket, no compression), timed with 0 to `--max-above` undo
 * entries above it, each a commit of `--updates` random updates. While a snapshot is written,
 * each commit in between adds one such entry, and the view consults them for every table entry.
 * Prints the median of `--runs` views at each count.
 * {{{
 *   bin/sbt "bench/runMain heapstate.bench.SnapshotView"
 *   bin/sbt "bench/runMain heapstate.bench.SnapshotView --max-above 8 --runs 15"
 * }}}
 */
object SnapshotView {
  def main(args: Array[String]): Unit = {
    val opts = BenchStores.options(args)
    val store = OneStore(opts, defaultValueBytes = OneStore.W1ValueBytes)
    val updates = opts.getOrElse("updates", "2500").toInt
    val maxAbove = opts.getOrElse("max-above", "4").toInt
    val runs = opts.getOrElse("runs", "9").toInt
    val live = store.live
    var sink = 0L
    val visitor = new LiveState.ViewVisitor { def apply(b: Array[Byte], at: Int, hash: Int): Unit = sink += hash }
    def medianMs(): Double = BenchStores.median((1 to runs).map { _ =>
      val started = System.nanoTime()
      live.writeSnapshotView(1, visitor)
      (System.nanoTime() - started) / 1e6
    })
    println(
      s"snapshot view of version 1, ${store.keys} keys, undo entries of $updates updates above it; median of $runs views")
    for (above <- 0 to maxAbove) {
      if (above > 0) { // as while a snapshot is written: appended, every undo entry kept
        val changes = store.randomChanges(updates)
        live.applyCommit(live.prepareCommit(changes), 0, inPlace = false)
        changes.release()
      }
      medianMs() // warm-up at this count
      println(f"$above%3d undo entries above: ${medianMs()}%7.1f ms")
    }
    require(sink != 42) // keeps the visits
  }
}
