package heapstate.engine

import java.util.concurrent.locks.ReentrantLock

import org.slf4j.LoggerFactory

import heapstate.io.{Codec, FaultInjection, StateFileException, StateFiles}
import heapstate.io.StateFileNames.{Journal, Snapshot, StateFile}

/** What the engine needs to know of the configuration. */
final case class EngineSettings(
    compactionInterval: Int,
    codec: Codec,
    undoVersions: Int,
    minVersionsToRetain: Int)

/** What one commit wrote. */
final case class CommitResult(version: Long, journalBytes: Long, keysWritten: Long, squashed: Long)

/**
 * The versions of one partition's state: which version the [[LiveState]] holds, how to reach
 * another one (roll back through undo entries, or rebuild from files), commit, snapshot and
 * cleanup. It knows files and bytes, not Spark's operators.
 *
 * Locking: task threads call in under this object's monitor. A snapshot holds `snapshotLock`
 * while it reads the live state, without the monitor; roll-backs and reloads take
 * `snapshotLock` inside the monitor, so they wait for a running snapshot, while commits do not.
 * The monitor is always taken before `snapshotLock`, never the other way round.
 */
final class StateEngine(
    val files: StateFiles,
    settings: EngineSettings,
    prefixOf: Option[Array[Byte] => Key]) {

  private val log = LoggerFactory.getLogger(classOf[StateEngine])
  private val snapshotLock = new ReentrantLock()

  @volatile private var state: LiveState = _
  /** Version of the newest snapshot known to hold for the current lineage (0: none). */
  @volatile private var newestSnapshot = 0L
  /** Version being snapshotted now, or -1. */
  @volatile private var snapshotInProgress = -1L
  /** The highest version seen on disk or committed here; a commit at or below it is a re-run. */
  private var highestKnownVersion = 0L

  def isLoaded: Boolean = state != null
  def live: LiveState = {
    val st = state
    if (st == null) throw new IllegalStateException("no version of this state store is loaded")
    st
  }
  def snapshotLag: Long = { val st = state; if (st == null) 0 else st.version - newestSnapshot }

  /** Makes the live state hold `version`, stepping back or reloading as needed. */
  def ensureAt(version: Long, loadEmpty: Boolean = false): LiveState = synchronized {
    val st = state
    if (loadEmpty) {
      withSnapshotLock { state = new LiveState(prefixOf, version); newestSnapshot = 0 }
      state
    } else if (st != null && st.version == version) {
      st
    } else if (st != null && st.canRollBackTo(version)) {
      withSnapshotLock {
        st.rollBackTo(version)
        if (newestSnapshot > version) newestSnapshot = 0 // that snapshot is of versions being redone
      }
      st
    } else {
      withSnapshotLock {
        state = null
        state = rebuild(version)
      }
      state
    }
  }

  /**
   * Commits `changes` on top of `baseVersion` as `baseVersion + 1`: the journal file first (so a
   * failed write changes nothing in memory), then the live state.
   */
  def commit(baseVersion: Long, changes: ChangeSet): CommitResult = synchronized {
    val st = ensureAt(baseVersion)
    val newVersion = baseVersion + 1
    val bytes = files.write(Journal, newVersion, settings.codec) { w =>
      changes.foreach { (key, value) =>
        if (Tombstone.is(value)) w.delete(key.bytes) else w.put(key.bytes, value)
      }
    }
    if (newVersion <= highestKnownVersion) {
      // A re-run of this version: a snapshot left by the earlier run no longer describes it.
      val stale = files.snapshotPath(newVersion)
      if (files.exists(stale)) {
        log.warn(s"Version $newVersion of ${files.dir} was committed again; deleting its old snapshot $stale")
        files.delete(stale)
      }
      if (newestSnapshot >= newVersion) newestSnapshot = 0
    }
    highestKnownVersion = math.max(highestKnownVersion, newVersion)
    FaultInjection.pause("published", files.journalPath(newVersion).toString)
    val byDepth = newVersion - settings.undoVersions
    val inProgress = snapshotInProgress
    st.applyCommit(changes, if (inProgress >= 0) math.min(byDepth, inProgress) else byDepth)
    CommitResult(newVersion, bytes, changes.size, changes.operations - changes.size)
  }

  /**
   * Writes a snapshot of the newest committed version when `compactionInterval` versions have
   * passed since the last one (or always, when `force`). Returns the version written. Runs on the
   * maintenance thread without blocking commits.
   */
  def snapshotIfDue(force: Boolean = false): Option[Long] = {
    // The version and `snapshotInProgress` are settled under the monitor, which commits hold for
    // their whole length: `s` is a committed version, and no commit drops undo entries above it.
    val picked: Option[(LiveState, Long)] = synchronized {
      val st = state
      val due = st != null && st.version > 0 && st.version != newestSnapshot &&
        (force || st.version - newestSnapshot >= settings.compactionInterval)
      val locked = due && (if (force) { snapshotLock.lock(); true } else snapshotLock.tryLock())
      if (locked) { snapshotInProgress = st.version; Some((st, st.version)) } else None
    }
    picked.map { case (st, s) =>
      try {
        val started = System.nanoTime()
        val bytes = files.write(Snapshot, s, settings.codec) { w =>
          st.writeSnapshotView(s, (key, value) => w.put(key.bytes, value))
        }
        newestSnapshot = math.max(newestSnapshot, s)
        log.info(f"Wrote snapshot of version $s for ${files.dir}: $bytes%d bytes in " +
          f"${(System.nanoTime() - started) / 1e6}%.0f ms")
        s
      } finally {
        snapshotInProgress = -1
        snapshotLock.unlock()
      }
    }
  }

  /**
   * Deletes files that no retained version needs. The newest `minVersionsToRetain` versions up to
   * the live one stay
   * recoverable: the newest snapshot at or below the oldest of them is kept, with every journal
   * above it; everything older goes.
   */
  def cleanup(): Seq[StateFile] = {
    val st = state
    val all = files.list()
    if (st == null || all.isEmpty) return Nil
    // Count from the live version, not the highest file: after a re-run, higher files belong to
    // an abandoned lineage and must not push the retained window past versions still needed.
    val latest = st.version
    val oldestRetained = latest - settings.minVersionsToRetain + 1
    val base = all.filter(f => f.kind == Snapshot && f.version <= oldestRetained).map(_.version).maxOption
    base.toSeq.flatMap { b =>
      val doomed = all.filter(f => f.version < b || (f.kind == Journal && f.version == b))
      doomed.foreach(f => files.delete(f.path))
      if (doomed.nonEmpty) log.info(s"Deleted ${doomed.size} files below version $b in ${files.dir}")
      doomed
    }
  }

  /** Builds the state at `endVersion` from the snapshot at exactly `snapshotVersion`. */
  def rebuildFromSnapshot(snapshotVersion: Long, endVersion: Long): LiveState = synchronized {
    val all = files.list()
    val st = new LiveState(prefixOf, snapshotVersion)
    if (snapshotVersion > 0) {
      val snap = all.find(f => f.kind == Snapshot && f.version == snapshotVersion).getOrElse {
        throw new StateFileException(files.snapshotPath(snapshotVersion), snapshotVersion,
          "there is no heapstate snapshot at this version to start from")
      }
      readSnapshot(st, snap)
    }
    val journals = all.filter(_.kind == Journal).map(f => f.version -> f).toMap
    for (v <- snapshotVersion + 1 to endVersion) {
      applyJournal(st, journals.getOrElse(v, throw StateFiles.missingJournal(files.dir, v)))
    }
    st.version = endVersion
    withSnapshotLock { state = st; newestSnapshot = snapshotVersion; highestKnownVersion = all.map(_.version).maxOption.getOrElse(0L) }
    st
  }

  /** The records of version `version`'s journal, in file order. */
  def readJournal(version: Long)(onPut: (Array[Byte], Array[Byte]) => Unit, onDelete: Array[Byte] => Unit): Unit = {
    val file = files.list().find(f => f.kind == Journal && f.version == version)
      .getOrElse(throw StateFiles.missingJournal(files.dir, version))
    files.read(file)(onPut, onDelete)
  }

  def close(): Unit = synchronized { withSnapshotLock { state = null } }

  private def withSnapshotLock[T](body: => T): T = {
    snapshotLock.lock()
    try body finally snapshotLock.unlock()
  }

  /**
   * Rebuilds `version` from the newest usable snapshot at or below it plus the journals above.
   * A damaged snapshot is skipped, with a warning naming it, in favour of an older one; a missing
   * or damaged journal that every candidate needs is an error naming that journal.
   */
  private def rebuild(version: Long): LiveState = {
    val all = files.list()
    highestKnownVersion = math.max(highestKnownVersion, all.map(_.version).maxOption.getOrElse(0L))
    if (version == 0) { newestSnapshot = 0; return new LiveState(prefixOf, 0) }
    val journals = all.filter(_.kind == Journal).map(f => f.version -> f).toMap
    val snapshots = all.filter(f => f.kind == Snapshot && f.version <= version).sortBy(-_.version)
    val candidates: Seq[Option[StateFile]] = snapshots.map(Some(_)) :+ None
    var skipped: StateFileException = null
    for (candidate <- candidates) {
      val from = candidate.map(_.version).getOrElse(0L)
      val missing = (from + 1 to version).find(v => !journals.contains(v))
      missing.foreach { v =>
        // Every older candidate needs this journal too. If a newer snapshot was skipped as
        // damaged, that snapshot is the file at fault: name it, not the long-deleted journal.
        throw (
          if (skipped == null) StateFiles.missingJournal(files.dir, v)
          else new StateFileException(skipped.path, skipped.version,
            s"it is damaged, and no older snapshot with journals can rebuild version $version " +
              s"(journal $v is gone): ${skipped.getMessage}", skipped))
      }
      val st = new LiveState(prefixOf, from)
      val snapshotOk = candidate.forall { snap =>
        try { readSnapshot(st, snap); true }
        catch {
          case e: StateFileException =>
            log.warn(s"Skipping damaged snapshot ${snap.path} (version ${snap.version}) of ${files.dir}; " +
              s"rebuilding version $version from an older snapshot and journals: ${e.getMessage}")
            if (skipped == null) skipped = e else skipped.addSuppressed(e)
            false
        }
      }
      if (snapshotOk) {
        for (v <- from + 1 to version) applyJournal(st, journals(v))
        st.version = version
        newestSnapshot = from
        return st
      }
    }
    throw skipped // unreachable: the last candidate (the empty state) has no snapshot to fail
  }

  private def readSnapshot(st: LiveState, file: StateFile): Unit =
    files.read(file)(
      (k, v) => st.load(Key(k), v),
      _ => throw new StateFileException(file.path, file.version, "a snapshot holds a delete record"))

  private def applyJournal(st: LiveState, file: StateFile): Unit =
    files.read(file)((k, v) => st.load(Key(k), v), k => st.load(Key(k), Tombstone.bytes))
}
