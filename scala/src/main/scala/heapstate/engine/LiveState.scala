package heapstate.engine

import java.util.{HashMap => JHashMap, HashSet => JHashSet}
import java.util.concurrent.{ConcurrentHashMap, ConcurrentSkipListMap}

/**
 * The one live copy of a partition's state, the undo log that lets it step back, and the view
 * that lets a snapshot of an older committed version be written while the live state moves on.
 *
 * == Versions ==
 * `map` holds the state as of committed version `version`. Committing version `w` (see
 * [[applyCommit]]) first publishes an undo entry `undo(w)`: for every key `w` changes, the key's
 * value as of `w - 1`, or [[Tombstone]] when it was absent. Only then does it change `map`.
 * Replaying `undo(w)` steps the map back from `w` to `w - 1` ([[rollBackTo]]).
 *
 * == Writers and readers ==
 * One writer (the task thread committing a batch, under the engine's lock) changes `map` and
 * `undo`. One snapshot writer at a time (the maintenance thread, or a task thread that Spark asked
 * to snapshot on commit) reads them concurrently through [[writeSnapshotView]]. Roll-backs and
 * reloads never run while a snapshot view is open: the engine's `snapshotLock` excludes them.
 *
 * == The snapshot view of version `s` ==
 *  1. For each entry of `map` (a ConcurrentHashMap iterates safely while written): read the value,
 *     then look for the key in the undo entries above `s`. If it is there, the key changed after
 *     `s` and step 2 emits it. Otherwise the value read is the value at `s`: any change to the key
 *     after `s` published its undo entry before changing the map, so a value read after such a
 *     change is always followed by finding the undo entry.
 *  1. For each key in the undo entries above `s`, in version order, the first entry's value is
 *     the value at `s`; emit it unless it is a tombstone.
 * A key that changes after step 1 passed it is emitted by both steps, with the same value (its
 * value at `s`). Readers therefore take a snapshot record as "the key has this value", and a
 * repeated key carries no new information. `docs/FORMAT.md` states this.
 *
 * == Memory ==
 * Undo entries are kept for the newest `undoVersions` commits, and for every version above a
 * snapshot being written. Older ones are dropped; an older version is then rebuilt from files.
 */
final class LiveState(val prefixOf: Option[Array[Byte] => Key], initialVersion: Long) {
  val map = new ConcurrentHashMap[Key, Array[Byte]]()
  private val undo = new ConcurrentSkipListMap[java.lang.Long, JHashMap[Key, Array[Byte]]]()
  private val byPrefix: Option[JHashMap[Key, JHashSet[Key]]] =
    prefixOf.map(_ => new JHashMap[Key, JHashSet[Key]]())

  @volatile var version: Long = initialVersion
  @volatile private var liveBytes = 0L
  @volatile private var undoBytes = 0L

  def numKeys: Long = map.mappingCount()
  def memoryBytes: Long = liveBytes + undoBytes
  def contains(key: Key): Boolean = map.containsKey(key)
  def get(probe: AnyRef): Array[Byte] = map.get(probe)

  /** Loads a record while building a state from files (single-threaded, before publication). */
  def load(key: Key, value: Array[Byte]): Unit =
    if (Tombstone.is(value)) mutate(key, null) else mutate(key, value)

  /**
   * Commits `changes` as version `version + 1`: publish the undo entry, then change the map.
   * `keepUndoAbove`: undo entries at or below this version may be dropped afterwards.
   */
  def applyCommit(changes: ChangeSet, keepUndoAbove: Long): Unit = {
    val newVersion = version + 1
    val entry = new JHashMap[Key, Array[Byte]](math.max(16, changes.size * 4 / 3 + 1))
    var entryBytes = 0L
    changes.foreach { (key, _) =>
      val prior = map.get(key)
      val recorded = if (prior == null) Tombstone.bytes else prior
      entry.put(key, recorded)
      entryBytes += MemoryModel.undoEntry(recorded)
    }
    undo.put(newVersion, entry) // published before any change to `map`
    undoBytes += entryBytes
    changes.foreach { (key, value) => mutate(key, if (Tombstone.is(value)) null else value) }
    version = newVersion
    dropUndoUpTo(keepUndoAbove)
  }

  /** Whether undo entries cover every version in (target, version]. */
  def canRollBackTo(target: Long): Boolean =
    target <= version && (target + 1 to version).forall(v => undo.containsKey(v))

  /** Steps back to `target`; the caller has checked [[canRollBackTo]] and holds the snapshot lock. */
  def rollBackTo(target: Long): Unit = {
    while (version > target) {
      val entry = undo.remove(version)
      entry.forEach { (key, prior) =>
        mutate(key, if (Tombstone.is(prior)) null else prior)
        undoBytes -= MemoryModel.undoEntry(prior)
      }
      version -= 1
    }
  }

  def dropUndoUpTo(v: Long): Unit = {
    var first = undo.firstEntry()
    while (first != null && first.getKey <= v) {
      first.getValue.forEach((_, prior) => undoBytes -= MemoryModel.undoEntry(prior))
      undo.remove(first.getKey)
      first = undo.firstEntry()
    }
  }

  /** Sets (value != null) or removes (value == null) one key in the map and the prefix index. */
  private def mutate(key: Key, value: Array[Byte]): Unit = {
    val previous = if (value == null) map.remove(key) else map.put(key, value)
    if (previous != null) liveBytes -= MemoryModel.liveEntry(key, previous)
    if (value != null) liveBytes += MemoryModel.liveEntry(key, value)
    byPrefix.foreach { index =>
      if (previous == null && value != null) {
        index.computeIfAbsent(prefixOf.get(key.bytes), _ => new JHashSet[Key]()).add(key)
        liveBytes += MemoryModel.prefixMember
      } else if (previous != null && value == null) {
        val prefix = prefixOf.get(key.bytes)
        val set = index.get(prefix)
        if (set != null) { set.remove(key); if (set.isEmpty) index.remove(prefix) }
        liveBytes -= MemoryModel.prefixMember
      }
    }
  }

  /** The live keys that share `prefix` (task thread only; the map does not move during a batch). */
  def keysWithPrefix(prefix: Key): java.util.Set[Key] = byPrefix match {
    case Some(index) =>
      val set = index.get(prefix)
      if (set == null) java.util.Collections.emptySet[Key]() else set
    case None => throw new IllegalStateException("this store was not created for prefix scans")
  }

  /**
   * Emits the state as of committed version `s` (<= `version`), as described in the class
   * comment, while commits may go on. The caller holds the snapshot lock and keeps undo entries
   * above `s` alive until this returns.
   */
  def writeSnapshotView(s: Long, emit: (Key, Array[Byte]) => Unit): Unit = {
    val later = undo.tailMap(s, false)
    def changedAfterS(key: Key): Boolean = {
      val it = later.values().iterator()
      while (it.hasNext) if (it.next().containsKey(key)) return true
      false
    }
    val entries = map.entrySet().iterator()
    while (entries.hasNext) {
      val e = entries.next()
      val value = e.getValue // read the value first, then look for a later change
      if (!changedAfterS(e.getKey)) emit(e.getKey, value)
    }
    val seen = new JHashSet[Key]()
    val it = later.values().iterator()
    while (it.hasNext) {
      it.next().forEach { (key, prior) =>
        if (seen.add(key) && !Tombstone.is(prior)) emit(key, prior)
      }
    }
  }
}
