package heapstate.io

import java.io.FileNotFoundException

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.checkpointing.{
  CheckpointFileManager,
  FileSystemBasedCheckpointFileManager
}

import heapstate.io.StateFileNames.{Journal, Kind, Snapshot, StateFile}

/**
 * The files of one state store directory, read and written through Spark's
 * `CheckpointFileManager`, so the store works on local disk, HDFS and object stores alike. Every
 * write is atomic: a reader sees the whole file or none of it.
 */
final class StateFiles(val dir: Path, hadoopConf: Configuration, partition: Int) {
  private val fm = CheckpointFileManager.create(dir, hadoopConf)
  /**
   * The local disk holding `dir` (see [[StateFiles.localFileSystem]]): its new files are written
   * through the cheaper manager, and its snapshots mapped instead of read (see [[openSnapshot]]).
   */
  private val localFs = StateFiles.localFileSystem(dir, hadoopConf)
  /** The cheaper manager for new local files; `fm` when there is none. See [[StateFiles.fastLocalManager]]. */
  private val fastFm = localFs.map(StateFiles.fastLocalManager(dir, hadoopConf, _)).getOrElse(fm)
  @volatile private var dirReady = false

  /** Whether `dir` is on the local disk, where a snapshot is mapped rather than read onto the heap. */
  def isLocal: Boolean = localFs.isDefined

  /** Every heapstate file in the directory, by version then kind (journal before snapshot). */
  def list(): Seq[StateFile] = {
    val statuses =
      try fm.list(dir)
      catch { case _: FileNotFoundException => Array.empty[org.apache.hadoop.fs.FileStatus] }
    statuses.toSeq.flatMap { st =>
      StateFileNames.parse(st.getPath.getName).map { n =>
        StateFile(n.version, n.kind, st.getPath, st.getLen, n.id, n.base)
      }
    }.sortBy(f => (f.version, if (f.kind == Journal) 0 else 1))
  }

  def journalPath(version: Long, id: Option[String] = None, base: Option[String] = None): Path =
    StateFileNames.journal(dir, version, id, base)
  def snapshotPath(version: Long, id: Option[String] = None): Path = StateFileNames.snapshot(dir, version, id)

  /**
   * Writes the journal of `version` atomically, overwriting an older file of the same name (in
   * checkpoint format v1, a re-run batch commits its version again). `id` and `base` are the
   * checkpoint ids of format v2 (see [[StateFileNames]]). `records` writes the records and returns
   * the keys the version added minus those it removed, which the file ends with. Returns the
   * file's size in bytes.
   */
  def writeJournal(version: Long, codec: Codec, id: Option[String], base: Option[String])(
      records: StateFileWriter => Long): Long =
    writeAtomically(Journal, journalPath(version, id, base)) { out =>
      val writer =
        new StateFileWriter(out, StateFileFormat.Header(StateFileFormat.KindJournal, codec, version, partition))
      writer.finish(records(writer))
    }

  /**
   * Writes the snapshot of `version` atomically (see [[writeJournal]]), in buckets of about
   * `bucketBytes` of records; `pace` is called with the bytes of each entry collected and of each
   * bucket written (see [[SnapshotFileWriter]]), and may throw to give the snapshot up. `reuse`:
   * an earlier snapshot whose unchanged buckets are copied (see [[SnapshotFileWriter]]).
   */
  def writeSnapshot(version: Long, codec: Codec, bucketBytes: Int, id: Option[String] = None,
      pace: Int => Unit = _ => (), reuse: BucketReuse = null)(
      entries: SnapshotFileWriter => Unit): Long =
    writeAtomically(Snapshot, snapshotPath(version, id)) { out =>
      val header = StateFileFormat.Header(StateFileFormat.KindSnapshot, codec, version, partition)
      val writer = new SnapshotFileWriter(out, header, bucketBytes, pace, reuse)
      entries(writer)
      writer.finish()
    }

  /** Writes `path` through an atomic stream: `body` writes the file and returns its size. */
  private def writeAtomically(kind: Kind, path: Path)(body: java.io.OutputStream => Long): Long = {
    if (!dirReady) { fm.mkdirs(dir); dirReady = true }
    // Only a file that does not exist yet may go through `fastFm`: its rename silently keeps an
    // existing target. Overwrites (a re-run version) are rare and take Spark's default manager.
    val out = (if ((fastFm ne fm) && !fastFm.exists(path)) fastFm else fm).createAtomic(path, true)
    try {
      val size = body(out)
      FaultInjection.pause(if (kind == Journal) "journal" else "snapshot", path.toString)
      out.close()
      size
    } catch {
      // Any throwable: a journal's body runs the commit's look-ups too (see StateEngine's commit),
      // and an OutOfMemoryError there must not leave the temporary file and its handle behind.
      case e: Throwable =>
        try out.cancel()
        catch { case NonFatal(c) => e.addSuppressed(c) }
        throw e
    }
  }

  /** Reads `file`, handing records to the callbacks; see [[StateFileReader]] for the guarantees. */
  def read(file: StateFile)(onPut: (Array[Byte], Array[Byte]) => Unit, onDelete: Array[Byte] => Unit): FileSummary =
    withInput(file)(in =>
      StateFileReader.read(in, file.length, file.path, file.version, kindByte(file.kind), onPut, onDelete))

  /** Reads `file`, handing each put record over as one entry array (see [[StateFileReader.readEntries]]). */
  def readEntries(file: StateFile)(onEntry: Array[Byte] => Unit, onDelete: Array[Byte] => Unit): FileSummary =
    withInput(file)(in =>
      StateFileReader.readEntries(in, file.length, file.path, file.version, kindByte(file.kind), onEntry, onDelete))

  /**
   * Reads and checks the snapshot `file` whole, for reading bucket by bucket; `None` when it is
   * of format 1 (see [[StateFileReader.openSnapshot]]). On the local disk its body is mapped, not
   * copied onto the heap.
   */
  def openSnapshot(file: StateFile): Option[SnapshotBuckets] =
    withInput(file)(in =>
      StateFileReader.openSnapshot(in, file.length, file.path, file.version, localFs.map(_.pathToFile(file.path))))

  /** Opens `file` for `body` and closes it after; a file gone since listing is named as missing. */
  private def withInput[T](file: StateFile)(body: java.io.InputStream => T): T = {
    val in =
      try fm.open(file.path)
      catch {
        case e: FileNotFoundException =>
          throw new MissingStateFileException(file.path, file.version, s"it is missing (${e.getMessage})")
      }
    try body(in)
    finally in.close()
  }

  def exists(path: Path): Boolean = fm.exists(path)

  private def kindByte(kind: Kind): Byte =
    if (kind == Journal) StateFileFormat.KindJournal else StateFileFormat.KindSnapshot

  def delete(path: Path): Unit = fm.delete(path)
}

object StateFiles {
  /** Spark's setting for the checkpoint file manager class; when set, it is always honoured. */
  val FileManagerClassKey = "spark.sql.streaming.checkpointFileManagerClass"

  /**
   * Spark's default manager for a local path is the FileContext-based one, which, without
   * Hadoop's native library, forks `readlink` and `chmod` processes for every file (about 40 ms
   * per write on a 2-core machine, measured). The FileSystem-based manager writes the same
   * temporary file and renames it, atomically on a local disk, and forks nothing (see
   * [[LocalFileManager]]); but when the target exists its rename fails and the old file silently
   * stays, so it may only create new files.
   * Elsewhere (HDFS, object stores), and whenever the user names a manager, Spark's choice stands:
   * this is for a `dir` on the local disk `raw`, as [[localFileSystem]] finds it.
   */
  def fastLocalManager(
      dir: Path, hadoopConf: Configuration, raw: org.apache.hadoop.fs.RawLocalFileSystem): CheckpointFileManager =
    new LocalFileManager(dir, hadoopConf, raw)

  /** Hadoop's raw local file system holding `dir`, unless `dir` is elsewhere or the user names a manager. */
  def localFileSystem(dir: Path, hadoopConf: Configuration): Option[org.apache.hadoop.fs.RawLocalFileSystem] =
    if (hadoopConf.get(FileManagerClassKey) != null) None else rawLocal(dir.getFileSystem(hadoopConf))

  /** Hadoop's raw local file system under `fs`, when `fs` is the local disk (Hadoop's own classes for it). */
  private def rawLocal(fs: org.apache.hadoop.fs.FileSystem): Option[org.apache.hadoop.fs.RawLocalFileSystem] =
    fs match {
      case raw: org.apache.hadoop.fs.RawLocalFileSystem => Some(raw)
      case checksummed: org.apache.hadoop.fs.LocalFileSystem => rawLocal(checksummed.getRawFileSystem)
      case _ => None
    }

  /**
   * The FileSystem-based manager, writing its temporary files straight to the local disk: no
   * Hadoop `.crc` beside each file (heapstate's files carry their own CRC-32C checksums, which
   * every read checks), half as many files per version, and the writer's 64 KiB writes go to the
   * disk as they are, instead of as one `write` call per 4.5 KiB of checksummed chunks.
   *
   * Not through Hadoop's raw local file system either: its `create` sets the new file's
   * permissions, which without Hadoop's native library forks a `chmod` process for every file.
   * That fork took about 7 ms of a W5 task's commit (1.3 ms of it CPU), two fifths of the whole
   * commit. A `FileOutputStream` makes the file with the process's umask, as Hadoop's default
   * permission does.
   */
  private final class LocalFileManager(dir: Path, hadoopConf: Configuration,
      raw: org.apache.hadoop.fs.RawLocalFileSystem)
      extends FileSystemBasedCheckpointFileManager(dir, hadoopConf) {
    override def createTempFile(path: Path): org.apache.hadoop.fs.FSDataOutputStream = {
      val file = raw.pathToFile(path)
      val out = new java.io.BufferedOutputStream(new java.io.FileOutputStream(file), StateFileFormat.BufferBytes)
      new org.apache.hadoop.fs.FSDataOutputStream(out, null)
    }
  }

  def missingJournal(dir: Path, version: Long, id: Option[String] = None): MissingStateFileException = {
    val path = id match {
      case None => StateFileNames.journal(dir, version)
      case Some(i) => new Path(dir, s"${version}_${i}_*${StateFileNames.JournalSuffix}")
    }
    new MissingStateFileException(path, version,
      "it is missing, and no snapshot at or above an " +
        "earlier version can rebuild this version without it")
  }
}
