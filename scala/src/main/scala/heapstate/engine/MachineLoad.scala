package heapstate.engine

import scala.util.control.NonFatal

/**
 * Whether other threads of the machine hold every core now, from Linux's count of the threads
 * that are running or ready to run (the fourth field of `/proc/loadavg`, "runnable/total"). A
 * background snapshot waits while they do (see [[SnapshotPacer]]), as it waits for busy tasks:
 * then it could only run on a core another thread wants. The tasks are not the only such
 * threads: G1's concurrent marking, the JIT compilers and Spark's driver are too. In W1 a batch
 * that a G1 marking cycle ran beside was the slowest of its run, and a snapshot writing in it
 * (50 to 90 ms of a core) made it slower still (stop 70).
 *
 * The count is the whole machine's, so it is used only where this JVM may use every processor
 * the machine has online: in a container held to fewer, the count includes threads of other
 * containers, whose cores this JVM cannot use, and the answer is always no.
 *
 * A reading serves for [[Fresh]]: the pacer asks at every entry it writes.
 */
object MachineLoad {
  private val LoadPath = "/proc/loadavg"
  private val OnlinePath = "/sys/devices/system/cpu/online"
  /** How long a reading serves, in nanoseconds. */
  private val Fresh = 1000000L

  private val processors: Int = Runtime.getRuntime.availableProcessors

  /** `/proc/loadavg`, open for reading again from its start, or null where it is not used (above). */
  @volatile private var file: java.io.RandomAccessFile = open()
  private val buf = new Array[Byte](128)
  @volatile private var readAt = 0L
  @volatile private var last = false

  private def open(): java.io.RandomAccessFile =
    try {
      val online = new String(java.nio.file.Files.readAllBytes(java.nio.file.Paths.get(OnlinePath)), "US-ASCII")
      if (cpuCount(online) != processors) null else new java.io.RandomAccessFile(LoadPath, "r")
    } catch { case NonFatal(_) => null }

  /** Whether this JVM reads the machine's load (Linux, and every online processor its own). */
  def available: Boolean = file != null

  /**
   * Whether the threads running or ready to run, other than the caller, are at least this JVM's
   * processors; false where the load is not read. `now` is `System.nanoTime`.
   */
  def othersHoldEveryCore(now: Long = System.nanoTime()): Boolean = {
    val f = file
    if (f == null) false
    else if (now - readAt < Fresh) last
    else
      synchronized {
        try {
          f.seek(0)
          val n = f.read(buf)
          last = runnable(buf, n) - 1 >= processors
        } catch {
          case NonFatal(_) => file = null; last = false
        }
        readAt = now
        last
      }
  }

  /** The runnable count of a `/proc/loadavg` line ("0.52 0.58 0.59 3/415 12345"): 3; -1 if none. */
  private[heapstate] def runnable(line: Array[Byte], length: Int): Int = {
    var i = 0
    var fields = 0
    while (i < length && fields < 3) { if (line(i) == ' ') fields += 1; i += 1 }
    var count = -1
    while (i < length && line(i) >= '0' && line(i) <= '9') {
      count = math.max(count, 0) * 10 + (line(i) - '0')
      i += 1
    }
    if (i < length && line(i) == '/') count else -1
  }

  /** The processors a list such as `/sys/devices/system/cpu/online` names ("0-3,8-11\n": 8). */
  private[heapstate] def cpuCount(list: String): Int =
    list.trim.split(',').iterator.filter(_.nonEmpty).map { range =>
      range.split('-') match {
        case Array(one) => one.trim.toInt; 1
        case Array(from, to) => to.trim.toInt - from.trim.toInt + 1
        case _ => throw new NumberFormatException(s"not a processor range: $range")
      }
    }.sum
}
