package heapstate.engine

/**
 * Spreads a background snapshot out in time: after every MiB of entries that shared the cores with
 * busy tasks, it sleeps long enough that the snapshot thread uses at most `dutyCycle` of one core
 * over the snapshot's wall time (every MiB without [[heapstate.TaskActivityPlugin]]; below). A
 * snapshot competes with the tasks for the cores (compressing a 300 MB state takes about a second
 * of one core); paced, it slows each batch it overlaps a little, instead of a few batches a lot.
 *
 * The share is counted in the thread's CPU time (`cpuClock`), not in the wall time it worked: a
 * chunk that took 10 ms of CPU is followed by a rest that makes its cycle last 10 ms / `dutyCycle`.
 * Paced by wall time, a snapshot that waits for a core while the tasks run counts that wait as
 * work and rests all the longer, and gets far less than its share on a busy machine: at a third,
 * a W1 store's snapshot took 6 or more batches, and the snapshots of four stores fell further
 * behind their interval with every round.
 *
 * After its rest, a chunk also waits while the tasks are busy (`busy`, see
 * [[StateEngine.tasksBusy]]): while a task anywhere in the JVM writes a store, from its `getStore`
 * to the end of its commit, polling every millisecond. A commit that shares the cores with a
 * snapshot took 15 to 25% longer in W1, which the rest alone does not avoid, since the commits of
 * all partitions fall in the same part of every batch. Waiting for the commits alone still left
 * W1's commits 1.19 times as long in the batches a snapshot overlapped as in the others (a warm
 * JVM, the means of four runs); waiting for the stateful stage, 0.99 times. A chunk ends at the
 * first write that finds the tasks busy, rests for the work it did, and waits. So a snapshot runs
 * in between: while Spark's driver plans the next batch and writes its logs, and while stateless
 * stages leave a core free. With [[heapstate.TaskActivityPlugin]] registered, tasks that write no
 * store count too, once they hold every core: otherwise a snapshot runs beside a stateless stage
 * that needs both cores, as W1's scan does (README, stop 39). So that a JVM whose tasks are
 * always busy still gets its snapshots, the waiting is on a budget: it stops once the snapshot
 * has spent [[SnapshotPacer.MaxYieldShare]] of its wall time waiting, which makes it at most
 * three times slower than its duty cycle alone; a chunk past that budget runs to its MiB.
 *
 * A chunk that no write of it found the tasks busy takes no rest, when `restWhenIdle` is off: it
 * ran on a core no task wanted, which the rest would leave idle. That is the default once
 * [[heapstate.TaskActivityPlugin]] counts the tasks, since only then does `busy` see a stateless
 * stage that holds every core; without the plugin every chunk rests. Resting in those gaps too,
 * a W1 store's snapshot (about 300 ms of CPU) took four to six batches, one store's at a time, so
 * each of four stores got one every 20 versions or so against a `compactionInterval` of 10, and
 * restarts replayed 20 to 30 journals (a store could go 30 versions without one); without the
 * rest, one or two batches, and 9 to 11. The price is the snapshot's CPU in the batches it
 * overlaps: in W1 the JVM used 0.7 to 1.7 s of CPU in them against 0.5 to 0.8 s in the others
 * (docs/PERFORMANCE_HISTORY.md, stops 42 and 44).
 *
 * The undo log keeps what the snapshot still needs for as long as it runs. A paced snapshot gives
 * up at its next pause when a roll-back, reload or close waits for it: none of them should wait
 * three times as long. `clock` (wall nanoseconds), `cpuClock` (this thread's CPU nanoseconds) and
 * `park` are the system's, except in tests.
 */
final class SnapshotPacer(
    dutyCycle: Double,
    abandon: () => Boolean,
    clock: () => Long = () => System.nanoTime(),
    park: Long => Unit = java.util.concurrent.locks.LockSupport.parkNanos(_: Long),
    cpuClock: () => Long = SnapshotPacer.threadCpuClock,
    busy: () => Boolean = () => StateEngine.tasksBusy,
    restWhenIdle: Boolean = !StateEngine.taskPluginActive,
    besideTasks: Long => Unit = _ => ()) {
  require(dutyCycle > 0 && dutyCycle <= 1, s"a duty cycle in (0, 1], not $dutyCycle")
  private var bytes = 0L
  /** Whether a write of the chunk under way found the tasks busy. */
  private var busySeen = false
  private val started = clock()
  private var chunkStarted = started
  private var chunkCpu = cpuClock()
  /** Wall nanoseconds spent waiting for busy tasks so far. */
  private var yielded = 0L

  /**
   * Counts `n` bytes written; pauses after each chunk, or sooner when the tasks are busy and the
   * budget allows waiting for them, and throws [[SnapshotPacer.Abandoned]] when `abandon()`.
   * Bytes written while the tasks are busy and the budget has no room go to `besideTasks`.
   */
  def wrote(n: Int): Unit = {
    bytes += n
    val tasks = busy()
    busySeen ||= tasks
    val waits = tasks && mayYield(clock())
    if (tasks && !waits) besideTasks(n)
    if (bytes >= SnapshotPacer.Chunk || waits) {
      if (abandon()) throw new SnapshotPacer.Abandoned
      if (busySeen || restWhenIdle) {
        val rest = ((cpuClock() - chunkCpu) / dutyCycle).toLong - (clock() - chunkStarted)
        if (rest > 0) park(rest)
      }
      yieldToTasks()
      if (abandon()) throw new SnapshotPacer.Abandoned
      bytes = 0
      busySeen = false
      chunkStarted = clock()
      chunkCpu = cpuClock()
    }
  }

  /** Whether the budget for waiting on busy tasks (see the class comment) has room at wall time `now`. */
  private def mayYield(now: Long): Boolean = yielded < SnapshotPacer.MaxYieldShare * (now - started)

  /** Waits while the tasks are busy, within the budget (see the class comment); stops early when `abandon()`. */
  private def yieldToTasks(): Unit = {
    var now = clock()
    while (busy() && mayYield(now) && !abandon()) {
      park(SnapshotPacer.YieldPoll)
      val after = clock()
      yielded += after - now
      now = after
    }
  }
}

object SnapshotPacer {
  /** A third: a snapshot takes a third of a core, and runs at least three times as long as unpaced. */
  val DefaultDutyCycle: Double = 1.0 / 3
  private val Chunk = 1L << 20
  /** The most of its wall time a snapshot spends waiting for busy tasks. */
  val MaxYieldShare: Double = 2.0 / 3
  /** How often a snapshot waiting for busy tasks looks again, in nanoseconds. */
  private val YieldPoll = 1000000L

  /**
   * The calling thread's CPU time in nanoseconds; its wall time (`System.nanoTime`) where the JVM
   * cannot measure thread CPU time, which paces as if the thread never waited for a core.
   */
  val threadCpuClock: () => Long =
    if (ThreadClocks.hasCpuClock) () => ThreadClocks.cpuNanos() else () => System.nanoTime()

  /** A paced snapshot gave up because a task or close needs the state; its file is not kept. */
  final class Abandoned extends Exception("snapshot abandoned", null, false, false)
}
