package heapstate.engine

import java.io.{File, RandomAccessFile}

import scala.util.control.NonFatal

/**
 * Whether G1's concurrent marking runs now in this JVM: whether one of its marking threads
 * ("G1 Main Marker", "G1 Conc#0" and so on, as HotSpot names them) is running or ready to run,
 * as Linux reports each thread's state (`/proc/self/task/<tid>/stat`). A background snapshot
 * waits while it runs (see [[SnapshotPacer]]), as it waits for busy tasks.
 *
 * In W1 on two cores a marking cycle takes a core for 130 to 230 ms about every ten batches, and
 * the batch beside it was most often its run's slowest. Of the batches a cycle ran beside, in the
 * runs of stops 70 and 71, those a snapshot also wrote in (50 to 100 ms of a core) took 1.18 to
 * 1.58 times their run's median, the others 1.00 to 1.35 times. Waiting whenever any other thread
 * of the machine held every core ([[https://man7.org/linux/man-pages/man5/proc_loadavg.5.html
 * /proc/loadavg]]'s count, the JIT compilers and the driver among them) was tried first: the
 * snapshots took so much longer that some was being written in every batch, the marking ones
 * included, and the stores' snapshots lagged up to 37 versions behind instead of 28 (stop 71).
 *
 * Elsewhere (not Linux, another collector, marking threads not found) it never says so. The
 * threads are looked for again every [[Rescan]] nanoseconds, as HotSpot may start marking workers
 * late; a reading serves for [[Fresh]], as the pacer asks at every entry it writes.
 */
object ConcurrentMarking {
  private val Tasks = new File("/proc/self/task")
  /** How long a reading serves, in nanoseconds. */
  private val Fresh = 1000000L
  /** How often the marking threads are looked for, in nanoseconds. */
  private val Rescan = 10L * 1000 * 1000 * 1000

  /** Whether `comm`, a thread's name as Linux lists it, is one of G1's concurrent marking threads. */
  private[heapstate] def isMarker(comm: String): Boolean =
    comm == "G1 Main Marker" || comm.startsWith("G1 Conc#")

  private var markers = Array.empty[RandomAccessFile]
  private val buf = new Array[Byte](512)
  private var scannedAt = 0L
  private var scanned = false
  @volatile private var readAt = 0L
  @volatile private var last = false
  @volatile private var broken = !Tasks.isDirectory

  /** Whether this JVM's marking threads were found (Linux, G1), as of the last look. */
  def available: Boolean = synchronized { lookIfDue(System.nanoTime()); markers.nonEmpty }

  /** Whether a G1 marking thread of this JVM is running or ready to run; `now` is `System.nanoTime`. */
  def running(now: Long = System.nanoTime()): Boolean =
    if (broken) false
    else if (now - readAt < Fresh) last
    else
      synchronized {
        try {
          lookIfDue(now)
          var any = false
          var i = 0
          while (!any && i < markers.length) {
            val f = markers(i)
            f.seek(0)
            any = stateOf(buf, f.read(buf)) == 'R'
            i += 1
          }
          last = any
        } catch {
          case NonFatal(_) => scanned = false; last = false // a thread gone: look again next time
        }
        readAt = now
        last
      }

  private def lookIfDue(now: Long): Unit =
    if (!broken && (!scanned || now - scannedAt > Rescan)) {
      markers.foreach(f => closeQuietly(f))
      markers = Array.empty
      try {
        val found = Option(Tasks.listFiles()).getOrElse(Array.empty[File]).flatMap { t =>
          try {
            val comm = new String(java.nio.file.Files.readAllBytes(new File(t, "comm").toPath), "UTF-8").trim
            if (isMarker(comm)) Some(new RandomAccessFile(new File(t, "stat"), "r")) else None
          } catch { case NonFatal(_) => None } // a thread that ended meanwhile
        }
        markers = found
      } catch { case NonFatal(_) => broken = true }
      scanned = true
      scannedAt = now
    }

  private def closeQuietly(f: RandomAccessFile): Unit =
    try f.close()
    catch { case NonFatal(_) => () }

  /**
   * The state letter of a `/proc/<pid>/task/<tid>/stat` line ("4242 (G1 Conc#0) R 1 ..."): the
   * first field after the name's closing parenthesis, found from the end, as a name may hold
   * spaces and parentheses. '?' when there is none.
   */
  private[heapstate] def stateOf(line: Array[Byte], length: Int): Char = {
    var close = length - 1
    while (close >= 0 && line(close) != ')') close -= 1
    if (close >= 0 && close + 2 < length && line(close + 1) == ' ') line(close + 2).toChar else '?'
  }
}
