package heapstate.io

import org.apache.hadoop.fs.Path

/**
 * The one place that knows how heapstate names its files inside a state store directory
 * (`<checkpoint>/state/<operatorId>/<partitionId>[/<storeName>]`).
 *
 * Checkpoint format version 1 (Spark's default):
 *   - `<version>.hs-journal`  the keys that version `version` changed (one per committed version)
 *   - `<version>.hs-snapshot` the full state as of `version` (written by compaction)
 *
 * Checkpoint format version 2 (`spark.sql.streaming.stateStore.checkpointFormatVersion=2`) gives
 * every commit a unique checkpoint id, so two attempts at one version never share a file:
 *   - `<version>_<id>_<baseId>.hs-journal` version `version` with id `id`, committed on top of
 *     version `version - 1` with id `baseId` (`<version>_<id>.hs-journal` on top of the empty
 *     version 0). The names alone give the lineage, so recovery can walk it from a listing.
 *   - `<version>_<id>.hs-snapshot` the full state of version `version` with id `id`.
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

  /**
   * A state file. `id` is its checkpoint id (format v2; `None` in format v1); `base` is, for a
   * journal, the checkpoint id of the version it was committed on top of.
   */
  final case class StateFile(
      version: Long,
      kind: Kind,
      path: Path,
      length: Long,
      id: Option[String] = None,
      base: Option[String] = None)

  /** What a file name says. */
  final case class Name(version: Long, kind: Kind, id: Option[String], base: Option[String])

  def journal(dir: Path, version: Long, id: Option[String] = None, base: Option[String] = None): Path = {
    require(id.isDefined || base.isEmpty, "a journal without a checkpoint id has no base id")
    new Path(dir, s"$version${id.map("_" + _).getOrElse("")}${base.map("_" + _).getOrElse("")}$JournalSuffix")
  }

  def snapshot(dir: Path, version: Long, id: Option[String] = None): Path =
    new Path(dir, s"$version${id.map("_" + _).getOrElse("")}$SnapshotSuffix")

  /** A checkpoint id heapstate can put in a name: Spark's ids are UUIDs. */
  def isValidId(id: String): Boolean =
    id.nonEmpty && id.length <= 64 && id.forall(c => c.isLetterOrDigit && c < 128 || c == '-')

  /** Parses a file name; `None` for anything that is not a heapstate state file. */
  def parse(name: String): Option[Name] = {
    val kind =
      if (name.endsWith(JournalSuffix)) Some(Journal)
      else if (name.endsWith(SnapshotSuffix)) Some(Snapshot)
      else None
    kind.flatMap { k =>
      val stem = name.dropRight(if (k == Journal) JournalSuffix.length else SnapshotSuffix.length)
      val parts = stem.split("_", -1).toSeq
      val digits = parts.head
      val version =
        if (digits.nonEmpty && digits.length <= 19 && digits.forall(_.isDigit)) digits.toLongOption else None
      val ids = parts.tail
      val idsOk = ids.forall(isValidId) && ids.length <= (if (k == Journal) 2 else 1)
      version.filter(_ => idsOk).map(v => Name(v, k, ids.headOption, ids.lift(1)))
    }
  }
}
