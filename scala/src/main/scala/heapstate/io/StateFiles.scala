package heapstate.io

import java.io.FileNotFoundException

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.checkpointing.{
  CheckpointFileManager,
  FileSystemBasedCheckpointFileManager
}
import org.apache.spark.sql.execution.streaming.state.StateStoreId

import heapstate.io.StateFileNames.{Journal, Kind, Snapshot, StateFile}

/**
 * The files of one state store directory, read and written through Spark's
 * `CheckpointFileManager`, so the store works on local disk, HDFS and object stores alike. Every
 * write is atomic: a reader sees the whole file or none of it.
 */
final class StateFiles(
    val dir: Path,
    hadoopConf: Configuration,
    partition: Int,
    copyRoots: Seq[java.io.File] = StateFiles.tempDirRoot,
    copyName: String = "") {
  private val fm = CheckpointFileManager.create(dir, hadoopConf)
  /**
   * The local disk holding `dir` (see [[StateFiles.localFileSystem]]): its files are written
   * through the cheaper manager, and its snapshots mapped instead of read (see [[openSnapshot]]).
   */
  private val localFs = StateFiles.localFileSystem(dir, hadoopConf)
  /** The cheaper manager for the local disk's files; `fm` when there is none. See [[StateFiles.fastLocalManager]]. */
  private val fastFm = localFs.map(StateFiles.fastLocalManager(dir, hadoopConf, _)).getOrElse(fm)
  @volatile private var dirReady = false

  /** Whether `dir` is on the local disk, where a snapshot is mapped rather than read onto the heap. */
  def isLocal: Boolean = localFs.isDefined

  /**
   * Off the local disk (HDFS, object stores), the store keeps a copy of the newest snapshot it
   * wrote or rebuilt from on the local disk, byte for byte the checkpoint's file: the next
   * snapshot copies its unchanged buckets from that copy, mapped, as a store on the local disk
   * does from the file itself, and a restart's state loads its buckets from it instead of holding
   * the snapshot's body on the heap. The copies go in a directory of this store's own under one
   * of `copyRoots` (Spark's local directories by default, see [[StateFiles.sparkLocalDirs]]; none
   * turns copies off), made when first needed ([[CopyDirs.make]], which also deletes those that
   * killed JVMs left); [[retainCopy]] keeps one, [[deleteCopies]] removes the directory. A copy
   * that cannot be written costs only what it would have saved: the snapshot is compressed
   * whole, the state read onto the heap.
   */
  private var copyDir: java.io.File = null
  private var copyDirFailed = false
  /**
   * The copy directory's name before its process id and random part (see [[CopyDirs.make]]):
   * `copyName` (the provider's names the operator, partition and store, see
   * [[StateFiles.copyNameOf]]) or the partition, made safe for a file name.
   */
  private val copyPrefix =
    "heapstate-" + (if (copyName.isEmpty) s"p$partition" else copyName).replaceAll("[^A-Za-z0-9_.-]", "_") + "-"

  /** The directory of the local copies, made now if needed; `None` when it cannot be. */
  private def copies(): Option[java.io.File] = synchronized {
    if (copyDir != null && !copyDir.isDirectory) { // removed from outside (a cleaner of /tmp): made again
      CopyDirs.forget(copyDir)
      copyDir = null
    }
    if (copyDir == null && !copyDirFailed && copyRoots.nonEmpty) {
      // The stores of a JVM take the roots in turn (whatever partitions the JVM was given); a
      // root that fails is skipped.
      val start = Math.floorMod(StateFiles.nextRoot.getAndIncrement(), copyRoots.length)
      val failures = Seq.newBuilder[String]
      (copyRoots.drop(start) ++ copyRoots.take(start)).iterator.takeWhile(_ => copyDir == null).foreach { root =>
        try copyDir = CopyDirs.make(root, copyPrefix)
        catch { case NonFatal(e) => failures += s"$root: $e" }
      }
      if (copyDir == null) {
        copyDirFailed = true
        StateFiles.log.warn(s"Cannot make a directory for local copies of the snapshots of $dir " +
          s"(see ${heapstate.HeapStateConf.LocalCopyDir.key}); every snapshot of it is compressed whole and read onto the heap: " +
          failures.result().mkString("; "))
      }
    }
    Option(copyDir)
  }

  /** Opens a local copy, mapped ([[StateFiles.openMapped]]); tests put a failing one in its place. */
  @volatile private[heapstate] var mapCopy: (java.io.File, Long, Path, Long) => Option[SnapshotBuckets] =
    StateFiles.openMapped

  /** Whether a snapshot may be copied from: on the local disk, or with a directory for local copies. */
  def mayCopy: Boolean = isLocal || synchronized(copyRoots.nonEmpty && !copyDirFailed)

  /** The directory of the local copies, when there is one (tests). */
  private[heapstate] def copyDirectory: Option[java.io.File] = synchronized(Option(copyDir))

  /** The local copy of the snapshot of `version` (checkpoint id `id`), whether or not it exists. */
  private def copyFile(version: Long, id: Option[String]): Option[java.io.File] =
    if (isLocal) None else copies().map(new java.io.File(_, snapshotPath(version, id).getName))

  /**
   * Opens the local copy of the snapshot of `version` (checkpoint id `id`) mapped, when there is
   * one of `length` bytes (see [[copyDir]]); errors name the copy.
   */
  def openCopy(version: Long, id: Option[String], length: Long): Option[SnapshotBuckets] =
    copyFile(version, id).filter(f => f.isFile && f.length == length)
      .flatMap(f => mapCopy(f, length, new Path(f.toURI), version))

  /** Deletes every local copy but the one of `keep` (a version and its checkpoint id). */
  def retainCopy(keep: Option[(Long, Option[String])]): Unit = {
    val kept = keep.flatMap { case (v, id) => copyFile(v, id) }
    val dir = synchronized(copyDir)
    if (dir != null) {
      Option(dir.listFiles()).toSeq.flatten
        .filterNot(f => kept.contains(f) || CopyDirs.isOwnerFile(f)).foreach(f => f.delete())
    }
  }

  /** Deletes the local copies and their directory (a later snapshot makes a new one). */
  def deleteCopies(): Unit = synchronized {
    if (copyDir != null) {
      CopyDirs.delete(copyDir)
      copyDir = null
    }
  }

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
   * file's size in bytes. `replacing`: an earlier file of the name is there (a re-run), and the
   * file is read back to see whether the checkpoint manager replaced it; a warning names it when
   * not (see [[replaced]]).
   */
  def writeJournal(version: Long, codec: Codec, id: Option[String], base: Option[String], replacing: Boolean = false)(
      records: StateFileWriter => Long): Long = {
    val path = journalPath(version, id, base)
    var writer: StateFileWriter = null
    val size = writeAtomically(Journal, path) { out =>
      writer = new StateFileWriter(out, StateFileFormat.Header(StateFileFormat.KindJournal, codec, version, partition))
      writer.finish(records(writer))
    }
    if (replacing && !replaced(path, size, writer.bodyCrc)) {
      journalsKept += 1
      StateFiles.log.warn(s"Version $version of $dir was committed again, but the checkpoint file manager " +
        s"(${fm.getClass.getName}) kept the earlier journal $path: its rename does not replace a file. " +
        "If this attempt's changes differ from the earlier one's, the files hold the earlier attempt's state " +
        "while this store goes on with this one's. Checkpoint format v2 " +
        "(spark.sql.streaming.stateStore.checkpointFormatVersion=2) gives each attempt files of its own; " +
        "Spark's FileContext-based manager replaces files")
    }
    size
  }

  @volatile private var journalsKept = 0L
  /** How many journals written over an earlier file of their name found that file kept (see [[replaced]]). */
  def journalsNotReplaced: Long = journalsKept

  /**
   * Whether the file at `path` is the journal just written over an earlier one (`size` bytes, its
   * body's checksum `crc`): a checkpoint manager whose rename does not replace an existing file
   * keeps the earlier one, and Spark's FileSystem-based manager does so without an error (its
   * `FileSystem.rename` returns false and the target exists). Reads the file's last bytes; only
   * a version committed again (checkpoint format v1) is checked. A read that fails says nothing
   * either way: true, with a warning. An attempt that wrote the same changes in another order,
   * or with another codec, also makes another file: the warning says "if".
   */
  private def replaced(path: Path, size: Long, crc: Int): Boolean =
    try {
      val expected =
        StateFileFormat.trailer(size - StateFileFormat.HeaderBytes - StateFileFormat.TrailerBytes, crc)
      val found = new Array[Byte](expected.length)
      val in = fm.open(path)
      try {
        in.seek(size - expected.length)
        var at = 0
        var n = 0
        while (at < found.length && n >= 0) { n = in.read(found, at, found.length - at); if (n > 0) at += n }
        at == found.length && in.read() < 0 && java.util.Arrays.equals(found, expected)
      } finally in.close()
    } catch {
      case _: java.io.EOFException => false // shorter than the one written
      case NonFatal(e) =>
        StateFiles.log.warn(s"Could not read back the journal $path written over an earlier one: $e")
        true
    }

  /**
   * Writes the snapshot of `version` atomically (see [[writeJournal]]), in buckets of about
   * `bucketBytes` of records; `pace` is called with the bytes of each entry collected and of each
   * bucket written (see [[SnapshotFileWriter]]), and may throw to give the snapshot up. `reuse`:
   * an earlier snapshot whose unchanged buckets are copied (see [[SnapshotFileWriter]]).
   * `expectedEntries`: about how many entries `entries` puts, when known; `dictionaryBytes`: the
   * size of the dictionary to compress zstd buckets with, 0 for none, and `dictionary` one to use
   * instead of training one (see [[SnapshotFileWriter]]).
   */
  def writeSnapshot(version: Long, codec: Codec, bucketBytes: Int, id: Option[String] = None,
      pace: Int => Unit = _ => (), reuse: BucketReuse = null, keepCopy: Boolean = false, expectedEntries: Int = 0,
      dictionaryBytes: Int = 0, dictionary: Array[Byte] = null)(entries: SnapshotFileWriter => Unit): Long =
    writeAtomically(Snapshot, snapshotPath(version, id), if (keepCopy) copyFile(version, id) else None) { out =>
      val header = StateFileFormat.Header(StateFileFormat.KindSnapshot, codec, version, partition)
      val writer =
        new SnapshotFileWriter(out, header, bucketBytes, pace, reuse, expectedEntries, dictionaryBytes, dictionary)
      entries(writer)
      writer.finish()
    }

  /**
   * Writes `path` through an atomic stream: `body` writes the file and returns its size. With
   * `copy`, the same bytes go to that local file too (see [[copyDir]]), which appears once the
   * file has.
   */
  private def writeAtomically(kind: Kind, path: Path, copy: Option[java.io.File] = None)(
      body: java.io.OutputStream => Long): Long = {
    if (!dirReady) { fm.mkdirs(dir); dirReady = true }
    val out = fastFm.createAtomic(path, true)
    val copying = copy.map(new StateFiles.CopyingOutput(out, _))
    try {
      val size = body(copying.getOrElse(out))
      FaultInjection.pause(if (kind == Journal) "journal" else "snapshot", path.toString)
      out.close()
      copying.foreach(_.publish(size))
      size
    } catch {
      // Any throwable: a journal's body runs the commit's look-ups too (see StateEngine's commit),
      // and an OutOfMemoryError there must not leave the temporary file and its handle behind.
      case e: Throwable =>
        try out.cancel()
        catch { case NonFatal(c) => e.addSuppressed(c) }
        copying.foreach(_.discard())
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

  /**
   * [[openSnapshot]], keeping a local copy of `file` off the local disk (see [[copyDir]]): the
   * file is copied to the local disk whole, then mapped from there; errors name `file`, of which
   * the copy is every byte. Returns the snapshot and whether its copy was kept. When the copy
   * cannot be made (or the file is not a bucketed snapshot), `file` is read as [[openSnapshot]]
   * reads it, and no copy is kept.
   */
  def openSnapshotKeepingCopy(file: StateFile): (Option[SnapshotBuckets], Boolean) =
    copyFile(file.version, file.id).flatMap(download(file, _)) match {
      case None => (openSnapshot(file), false)
      case Some(copy) =>
        // The copy holds every byte of `file`, but a failure to open or map it may be the local
        // disk's: `file` is then read as without a copy, and only what is wrong with it is named.
        val opened =
          try Right(mapCopy(copy, file.length, file.path, file.version))
          catch { case NonFatal(e) => Left(e) }
        opened match {
          case Right(Some(buckets)) => (Some(buckets), true)
          case Right(None) => copy.delete(); (openSnapshot(file), false) // format 1: read whole, no buckets
          case Left(e) =>
            copy.delete()
            StateFiles.log.warn(s"Could not open the local copy $copy of snapshot ${file.path}; reading the " +
              s"snapshot itself: $e")
            (openSnapshot(file), false)
        }
    }

  /**
   * Copies `file` whole to the local file `to`; `None`, with nothing left behind, when it is not
   * `file.length` bytes or a read or write fails: [[openSnapshot]] then reads `file` and names
   * what is wrong with it. A file gone since listing is an error naming it, as there.
   */
  private def download(file: StateFile, to: java.io.File): Option[java.io.File] = {
    val tmp = StateFiles.tmpOf(to)
    try {
      val copied = withInput(file) { in =>
        val out = new java.io.BufferedOutputStream(new java.io.FileOutputStream(tmp), StateFileFormat.BufferBytes)
        try in.transferTo(out)
        finally out.close()
      }
      if (copied != file.length) { tmp.delete(); None }
      else { StateFiles.moveIntoPlace(tmp, to); Some(to) }
    } catch {
      case e: StateFileException => tmp.delete(); throw e
      case NonFatal(e) =>
        tmp.delete()
        StateFiles.log.warn(s"Could not copy snapshot ${file.path} to $to; reading it onto the heap: $e")
        None
    }
  }

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
  private val log = org.slf4j.LoggerFactory.getLogger(classOf[StateFiles])

  /** The JVM's temporary directory (`java.io.tmpdir`), as the one root for local copies. */
  def tempDirRoot: Seq[java.io.File] = Seq(new java.io.File(System.getProperty("java.io.tmpdir")))

  /**
   * The name a store's directory of local copies starts with (after `heapstate-`): its operator
   * and partition, and its store name when that is not the default one (a stream-stream join's
   * four stores), so that a directory found on an executor's disk names the store it serves.
   */
  def copyNameOf(operatorId: Long, partition: Int, storeName: String): String =
    s"op$operatorId-p$partition" + (if (storeName == StateStoreId.DEFAULT_STORE_NAME) "" else s"-$storeName")

  /** The next root a store of this JVM makes its directory of local copies under (see `copies`). */
  private val nextRoot = new java.util.concurrent.atomic.AtomicInteger()

  /**
   * The directories Spark gives this JVM for its scratch files, taken from the sources Spark
   * reads, in its order of precedence: the cluster manager's (`LOCAL_DIRS` in a YARN container,
   * else `SPARK_EXECUTOR_DIRS`, which a standalone worker sets, or `SPARK_LOCAL_DIRS`, which
   * Kubernetes and standalone set), else `spark.local.dir`, else `java.io.tmpdir`. Unlike Spark,
   * a blank entry is dropped and a source with none falls through to the next, and YARN's list
   * is not shuffled (the stores take the directories in turn). `sparkConf` reads Spark's
   * configuration, `env` the environment.
   */
  def sparkLocalDirs(sparkConf: String => Option[String], env: String => Option[String]): Seq[java.io.File] = {
    def dirs(value: Option[String], separator: String): Option[Seq[String]] =
      value.map(_.split(separator).map(_.trim).filter(_.nonEmpty).toSeq).filter(_.nonEmpty)
    val yarn = if (env("CONTAINER_ID").isDefined) dirs(env("LOCAL_DIRS"), ",") else None
    yarn
      .orElse(dirs(env("SPARK_EXECUTOR_DIRS"), java.io.File.pathSeparator))
      .orElse(dirs(env("SPARK_LOCAL_DIRS"), ","))
      .orElse(dirs(sparkConf("spark.local.dir"), ","))
      .map(_.map(new java.io.File(_)))
      .getOrElse(tempDirRoot)
  }

  /** The temporary file a local copy `f` is written to before [[moveIntoPlace]]. */
  private def tmpOf(f: java.io.File): java.io.File = new java.io.File(f.getParentFile, f.getName + ".tmp")

  /** Renames the whole file `tmp` to `to` at once (one POSIX `rename`), replacing an older one. */
  private def moveIntoPlace(tmp: java.io.File, to: java.io.File): Unit =
    java.nio.file.Files.move(tmp.toPath, to.toPath, java.nio.file.StandardCopyOption.REPLACE_EXISTING,
      java.nio.file.StandardCopyOption.ATOMIC_MOVE)

  /**
   * Opens the snapshot in the local file `f` (`length` bytes), mapped, its errors naming `path`
   * and `version` (see [[StateFileReader.openSnapshot]]).
   */
  private def openMapped(f: java.io.File, length: Long, path: Path, version: Long): Option[SnapshotBuckets] = {
    val in = new java.io.FileInputStream(f)
    try StateFileReader.openSnapshot(in, length, path, version, Some(f))
    finally in.close()
  }

  /**
   * Writes what a snapshot writes to `out` to the local file `copy` as well, through a temporary
   * file that [[publish]] renames once `out` is closed. The copy is an aid, never a cause of
   * failure: once writing it fails, it is given up and `out` alone goes on.
   */
  private final class CopyingOutput(out: java.io.OutputStream, copy: java.io.File) extends java.io.OutputStream {
    private val tmp = tmpOf(copy)
    private var local: java.io.OutputStream =
      try new java.io.BufferedOutputStream(new java.io.FileOutputStream(tmp), StateFileFormat.BufferBytes)
      catch { case NonFatal(e) => giveUp(e); null }
    private var written = 0L

    private def giveUp(e: Throwable): Unit = {
      if (local != null)
        try local.close()
        catch { case NonFatal(_) => }
      local = null
      tmp.delete()
      log.warn(s"Could not write the local copy $copy of a snapshot; the next snapshot compresses every bucket: $e")
    }
    private def toCopy(write: java.io.OutputStream => Unit): Unit =
      if (local != null)
        try write(local)
        catch { case NonFatal(e) => giveUp(e) }

    override def write(b: Int): Unit = { out.write(b); toCopy(_.write(b)); written += 1 }
    override def write(b: Array[Byte], off: Int, len: Int): Unit = {
      out.write(b, off, len); toCopy(_.write(b, off, len)); written += len
    }
    override def flush(): Unit = out.flush()
    /** Nothing: `out` is closed by its owner (see `writeAtomically`), the copy by [[publish]] or [[discard]]. */
    override def close(): Unit = ()

    /** Once `out` is closed: renames the copy into place when it holds all `size` bytes of the file. */
    def publish(size: Long): Unit = {
      toCopy(_.close())
      if (local != null) {
        local = null
        if (written != size) tmp.delete()
        else
          try moveIntoPlace(tmp, copy)
          catch { case NonFatal(e) => giveUp(e) }
      }
    }
    /** When the file was not written: drops the copy. */
    def discard(): Unit = { toCopy(_.close()); local = null; tmp.delete() }
  }

  /** Spark's setting for the checkpoint file manager class; when set, it is always honoured. */
  val FileManagerClassKey = "spark.sql.streaming.checkpointFileManagerClass"

  /**
   * Spark's default manager for a local path is the FileContext-based one, which, without
   * Hadoop's native library, forks `readlink` and `chmod` processes for every file (about 40 ms
   * per write on a 2-core machine, measured). [[LocalFileManager]] writes the same temporary file
   * and renames it over the target with one POSIX `rename`, atomic on a local disk, and forks
   * nothing, whether or not the target exists (a re-run version's journal replaces the earlier
   * one, as with Spark's default manager).
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
   *
   * Nor is the finished file renamed through Hadoop: the FileSystem-based manager's rename keeps
   * an existing target and reports nothing. `Files.move` with `ATOMIC_MOVE` is one `rename` call,
   * which replaces the target at once. A target written by a checksummed Hadoop layer (Spark's
   * default manager, or an earlier heapstate that wrote re-runs through it) may have a `.crc`
   * beside it, which would not match the new file, and Hadoop's `FileSystem` reads check it (a
   * stale one fails Spark's FileSystem-based manager's reads). It goes first, so a crash between
   * the two steps leaves the old file without its `.crc`, which Hadoop reads unchecked
   * (heapstate's own checksums still are checked).
   */
  private final class LocalFileManager(dir: Path, hadoopConf: Configuration,
      raw: org.apache.hadoop.fs.RawLocalFileSystem)
      extends FileSystemBasedCheckpointFileManager(dir, hadoopConf) {
    override def createTempFile(path: Path): org.apache.hadoop.fs.FSDataOutputStream = {
      val file = raw.pathToFile(path)
      val out = new java.io.BufferedOutputStream(new java.io.FileOutputStream(file), StateFileFormat.BufferBytes)
      new org.apache.hadoop.fs.FSDataOutputStream(out, null)
    }

    override def renameTempFile(srcPath: Path, dstPath: Path, overwriteIfPossible: Boolean): Unit =
      if (!overwriteIfPossible) super.renameTempFile(srcPath, dstPath, overwriteIfPossible)
      else {
        val (src, dst) = (raw.pathToFile(srcPath), raw.pathToFile(dstPath))
        try {
          java.nio.file.Files.deleteIfExists(new java.io.File(dst.getParentFile, s".${dst.getName}.crc").toPath)
          moveIntoPlace(src, dst)
        } catch {
          // Spark's stream has marked itself closed, so its cancel would leave the temporary file.
          case e: java.io.IOException => src.delete(); throw e
        }
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
