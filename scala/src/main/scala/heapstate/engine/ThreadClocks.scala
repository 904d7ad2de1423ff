package heapstate.engine

import scala.util.control.NonFatal

/**
 * The calling thread's own clocks: the CPU time it used (the commit's metrics in
 * `HeapStateStoreProvider`, and [[SnapshotPacer]]), and the time it was ready to run but waited
 * for a core (the commit's metrics).
 */
object ThreadClocks {
  private val threads = java.lang.management.ManagementFactory.getThreadMXBean

  /** Whether the JVM measures the calling thread's CPU time ([[cpuNanos]]). */
  val hasCpuClock: Boolean = threads.isCurrentThreadCpuTimeSupported && threads.isThreadCpuTimeEnabled

  /** The calling thread's CPU time in nanoseconds; 0 where the JVM cannot measure it. */
  def cpuNanos(): Long = if (hasCpuClock) threads.getCurrentThreadCpuTime else 0L

  private val SchedStat = java.nio.file.Paths.get("/proc/thread-self/schedstat")

  /** Whether Linux's per-thread scheduler figures may be read; turned off once a read fails. */
  @volatile private var hasSchedStat = java.nio.file.Files.isReadable(SchedStat)

  /**
   * The calling thread's time ready to run but waiting for a core, in nanoseconds: the second
   * figure of Linux's `/proc/thread-self/schedstat` (time on a core, time on a run queue, time
   * slices), or -1 where it cannot be read. The file is opened, read and closed at each call (a
   * few microseconds): kept open, it would stay open for as long as its thread lived.
   */
  def runQueueNanos(): Long =
    if (!hasSchedStat) -1L
    else
      try {
        val line = java.nio.file.Files.readAllBytes(SchedStat)
        runQueueOf(line, line.length)
      } catch {
        case NonFatal(_) => hasSchedStat = false; -1L
      }

  /** The second figure of a `schedstat` line ("123 4567 8\n": 4567); -1 when there is none. */
  private[heapstate] def runQueueOf(line: Array[Byte], length: Int): Long = {
    var i = 0
    while (i < length && line(i) >= '0' && line(i) <= '9') i += 1 // the time on a core
    if (i == 0 || i >= length || line(i) != ' ') -1L
    else {
      i += 1
      val from = i
      var queued = 0L
      while (i < length && line(i) >= '0' && line(i) <= '9') { queued = queued * 10 + (line(i) - '0'); i += 1 }
      if (i == from) -1L else queued
    }
  }
}
