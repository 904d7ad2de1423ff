package heapstate.io

import org.apache.hadoop.fs.Path

/**
 * The one place that knows how heapstate names its files inside a state store directory
 * (`<checkpoint>/state/<operatorId>/<partitionId>[/<storeName>]`).
 *
 *   - `<version>.hs-journal`  the keys that version `version` changed (one per committed version)
 *   - `<version>.hs-snapshot` the full state as of `version` (written by compaction)
 *
 * The suffixes differ from the HDFS provider's `.delta`/`.snapshot`, so the two providers' files
 * can sit in one directory during a migration without ever being mistaken for each other.
 */
object StateFileNames {
  val JournalSuffix = ".hs-journal"
  val SnapshotSuffix = ".hs-snapshot"

  sealed trait Kind
  case object Journal extends Kind
  case object Snapshot extends Kind

  final case class StateFile(version: Long, kind: Kind, path: Path, length: Long)

  def journal(dir: Path, version: Long): Path = new Path(dir, s"$version$JournalSuffix")
  def snapshot(dir: Path, version: Long): Path = new Path(dir, s"$version$SnapshotSuffix")

  /** Parses a file name; `None` for anything that is not a heapstate state file. */
  def parse(name: String): Option[(Long, Kind)] = {
    def versionOf(suffix: String): Option[Long] = {
      val digits = name.dropRight(suffix.length)
      if (digits.nonEmpty && digits.length <= 19 && digits.forall(_.isDigit)) digits.toLongOption
      else None
    }
    if (name.endsWith(JournalSuffix)) versionOf(JournalSuffix).map(_ -> Journal)
    else if (name.endsWith(SnapshotSuffix)) versionOf(SnapshotSuffix).map(_ -> Snapshot)
    else None
  }
}
