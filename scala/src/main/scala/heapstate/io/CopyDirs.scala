package heapstate.io

import java.io.File
import java.nio.channels.FileChannel
import java.nio.file.{Files, StandardCopyOption, StandardOpenOption}

import scala.util.control.NonFatal

/**
 * The directories in which stores off the local disk keep local copies of their snapshots (see
 * `StateFiles.copyDir`): making them, deleting them, and deleting those a JVM left behind.
 *
 * A JVM deletes its directories when its stores close, and at its exit ([[live]]). A JVM that is
 * killed (an executor lost to the OOM killer, say) cannot. So each directory holds a file,
 * [[OwnerFileName]], on which its JVM holds a lock for as long as it lives ([[claim]]): the
 * operating system drops the lock when the process ends, however it ends. The first time a JVM
 * makes a directory under a root, it deletes the directories there whose `.owner` no process
 * holds ([[sweep]]). That matters where Spark's scratch directories outlive an executor: on a
 * YARN node (the application's, which its containers share) and on a host that runs a driver in
 * local mode, a long query that loses executors would otherwise keep their copies until the
 * application ends.
 *
 * A directory's name holds its JVM's process id, and a sweep never opens a directory with this
 * JVM's: closing any channel on a file drops every lock the JVM holds on it, so opening its own
 * `.owner` (from another class loader's copy of these classes, say) would give it up.
 *
 * The locks are POSIX record locks: the roots must be on the host's own disk (a network disk
 * mounted without shared locks would let another host see a live directory as left behind).
 * Never deleted: directories without an `.owner` (made by an earlier heapstate, or whose claim
 * failed, or whose JVM was killed between making the directory and claiming it, or whose
 * `.owner` a cleaner of `/tmp` removed), and directories whose process id is this JVM's.
 */
private[heapstate] object CopyDirs {
  private val log = org.slf4j.LoggerFactory.getLogger(getClass)

  /** The file in a directory of copies that its JVM holds a lock on while it lives. */
  val OwnerFileName = ".owner"

  /** The part of a directory's name that says this JVM made it (see [[isThisJvms]]). */
  private val pidTag = s"pid${ProcessHandle.current.pid}-"

  /**
   * The directories of copies of this JVM's stores not closed yet, deleted when the JVM exits: an
   * executor that ends without closing its stores (Spark's doesn't, at its end) leaves none
   * behind, unless it is killed.
   */
  private val live: java.util.Set[File] = {
    val dirs = java.util.concurrent.ConcurrentHashMap.newKeySet[File]()
    Runtime.getRuntime.addShutdownHook(new Thread(() => dirs.forEach(d => deleteDir(d)), "heapstate-copies-cleanup"))
    dirs
  }

  /** Guards [[claims]] and [[sweep]]. */
  private val ownership = new Object
  /** This JVM's locks on its directories (see [[claim]]), by directory. */
  private val claims = new java.util.HashMap[File, FileChannel]()
  /** The roots this JVM has swept (see [[make]]). */
  private val sweptRoots = java.util.concurrent.ConcurrentHashMap.newKeySet[File]()

  /**
   * Makes a directory of copies under `root`, named `prefix`, this JVM's process id and a random
   * part, and claims it; sweeps `root` first the first time. Throws when it cannot be made.
   */
  def make(root: File, prefix: String): File = {
    Files.createDirectories(root.toPath)
    if (sweptRoots.add(root.getAbsoluteFile)) {
      try sweep(root)
      catch { case NonFatal(e) => log.warn(s"Could not look for local copies left behind under $root: $e") }
    }
    val made = Files.createTempDirectory(root.toPath, prefix + pidTag).toFile
    live.add(made)
    claim(made)
    made
  }

  /** Deletes this JVM's directory `dir` and drops its claim. */
  def delete(dir: File): Unit = {
    deleteDir(dir)
    forget(dir)
  }

  /** Drops this JVM's claim on `dir`, which is gone (deleted from outside, by a cleaner of `/tmp`). */
  def forget(dir: File): Unit = {
    live.remove(dir)
    ownership.synchronized(Option(claims.remove(dir.getAbsoluteFile))).foreach { c =>
      try c.close()
      catch { case NonFatal(_) => () }
    }
  }

  /** Whether `f`, a file in a directory of copies, is that directory's and not a copy. */
  def isOwnerFile(f: File): Boolean = f.getName.startsWith(OwnerFileName)

  /**
   * Makes `dir` this JVM's: an exclusive lock on its [[OwnerFileName]], taken on a temporary
   * name and then renamed (the lock stays with the file), so that a sweep never finds an
   * `.owner` nobody holds yet. When that fails (a file system without locks), the directory
   * stays unclaimed, which no sweep deletes: its copies still serve.
   */
  private def claim(dir: File): Unit = ownership.synchronized {
    var channel: FileChannel = null
    val tmp = new File(dir, OwnerFileName + ".tmp")
    try {
      channel = FileChannel.open(tmp.toPath, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)
      channel.lock()
      Files.move(tmp.toPath, new File(dir, OwnerFileName).toPath, StandardCopyOption.ATOMIC_MOVE)
      claims.put(dir.getAbsoluteFile, channel)
    } catch {
      case NonFatal(e) =>
        if (channel != null) {
          try channel.close()
          catch { case NonFatal(c) => e.addSuppressed(c) }
        }
        tmp.delete()
        log.info(s"Cannot claim the directory of local copies $dir; if this JVM is killed, no other will delete it: $e")
    }
  }

  /** Whether this JVM made `dir` (by the process id in its name). */
  private def isThisJvms(dir: File): Boolean = dir.getName.contains("-" + pidTag)

  /**
   * Deletes the directories of copies under `root` that a JVM left behind: those named
   * `heapstate-*`, not this JVM's, whose `.owner` no process holds a lock on. Decides under
   * [[ownership]] and deletes after (see [[deleteDir]]). Returns how many it deleted.
   */
  def sweep(root: File): Int = {
    val left = ownership.synchronized {
      Option(root.listFiles()).toSeq.flatten.filter(d => d.getName.startsWith("heapstate-") && leftBehind(d))
    }
    left.count { d =>
      val bytes = Option(d.listFiles()).toSeq.flatten.map(_.length).sum
      deleteDir(d)
      if (d.exists()) log.warn(s"Could not delete all of $d, local copies of snapshots that a JVM left behind")
      else log.info(s"Deleted $d ($bytes bytes): local copies of snapshots that a JVM left behind when it ended")
      !d.exists()
    }
  }

  /** Whether `dir` is not this JVM's and has an `.owner` that no process holds. */
  private def leftBehind(dir: File): Boolean = {
    val owner = new File(dir, OwnerFileName)
    try !isThisJvms(dir) && owner.isFile && unlocked(owner)
    catch {
      case NonFatal(e) =>
        log.debug(s"Could not tell whether $dir is left behind: $e")
        false
    }
  }

  /**
   * Whether no process holds a lock on `owner`, another JVM's: a shared lock needs only read
   * access, and its owner's exclusive lock refuses it.
   */
  private def unlocked(owner: File): Boolean = {
    val channel = FileChannel.open(owner.toPath, StandardOpenOption.READ)
    try channel.tryLock(0L, Long.MaxValue, true) != null
    finally channel.close()
  }

  /**
   * Deletes the directory `d` and its files, its `.owner` last, so that a deletion cut short
   * (a sweep's, or this JVM's killed meanwhile) leaves a directory the next sweep still finds.
   */
  private def deleteDir(d: File): Unit = {
    val (owner, copies) = Option(d.listFiles()).toSeq.flatten.partition(_.getName == OwnerFileName)
    (copies ++ owner).foreach(_.delete())
    d.delete()
  }
}
