package heapstate.io

/**
 * Pauses at named points of a write, so that a test can kill the process exactly there with
 * SIGKILL: the reliability tests' way to hit "during commit" and "while a snapshot is being
 * written" on purpose rather than by luck. Off unless the JVM is started with
 * `-Dheapstate.faultInjection.pause=<point>:<n>:<ms>`: at the n-th time (counted from 1) the
 * process reaches `<point>`, it prints `HEAPSTATE-PAUSE <point> <path>` on stderr and sleeps
 * `<ms>` milliseconds. The points:
 *
 *  - `journal`, `snapshot`: the file's content is written to its temporary file, not yet renamed
 *    into place;
 *  - `published`: a commit's journal is in place, the live state not yet changed (the query's
 *    commit log does not record the batch yet).
 *
 * With the property unset (always, outside these tests) `pause` is a read of an empty option.
 */
object FaultInjection {
  final case class Pause(point: String, nth: Int, millis: Long)

  private val configured: Option[Pause] = Option(System.getProperty("heapstate.faultInjection.pause")).map { spec =>
    spec.split(":") match {
      case Array(point, n, ms) if Points(point) && n.toIntOption.exists(_ > 0) && ms.toLongOption.exists(_ >= 0) =>
        Pause(point, n.toInt, ms.toLong)
      case _ =>
        throw new IllegalArgumentException(s"heapstate.faultInjection.pause: '$spec' is not " +
          s"<point>:<n>:<ms> with point one of ${Points.mkString(", ")}, n >= 1 and ms >= 0")
    }
  }
  private lazy val Points = Set("journal", "snapshot", "published")
  private val reached = new java.util.concurrent.atomic.AtomicInteger()

  def pause(point: String, what: => String): Unit = configured match {
    case Some(p) if p.point == point && reached.incrementAndGet() == p.nth =>
      System.err.println(s"HEAPSTATE-PAUSE $point $what")
      System.err.flush()
      Thread.sleep(p.millis)
    case _ =>
  }
}
