package heapstate.engine

import java.util.{HashMap => JHashMap, HashSet => JHashSet}
import java.util.concurrent.ConcurrentSkipListMap

/**
 * The one live copy of a partition's state, the undo log that lets it step back, and the view
 * that lets a snapshot of an older committed version be written while the live state moves on.
 *
 * == Versions ==
 * `table` holds the state as of committed version `version`, one [[Entry]] (key and value rows
 * in one array) per key. Committing version `w` (see [[applyCommit]]) first publishes an undo
 * entry `undo(w)`: for every key `w` changes, the key's entry as of `w - 1`, or [[Tombstone]]
 * when it was absent. Only then does it change `table`. Replaying `undo(w)` steps the table back
 * from `w` to `w - 1` ([[rollBackTo]]). When `w - 1` was empty (a query's first batch, a bulk
 * load), `undo(w)` is the marker [[LiveState.FromEmpty]] instead of one record per key: stepping
 * back clears the table, and every key present after `w` is one that changed after `w - 1`.
 *
 * == Writers and readers ==
 * One writer (the task thread committing a batch, under the engine's lock) changes `map` and
 * `undo`. One snapshot writer at a time (the maintenance thread, or a task thread that Spark asked
 * to snapshot on commit) reads them concurrently through [[writeSnapshotView]]. Roll-backs and
 * reloads never run while a snapshot view is open: the engine's `snapshotLock` excludes them.
 *
 * == The snapshot view of version `s` ==
 *  1. For each entry of `table` (an [[EntryTable]] iterates safely while one writer works): take
 *     the entry, then look for its key in the undo entries above `s`. If it is there, the key
 *     changed after `s` and step 2 emits it. Otherwise the entry is the one at `s`: any change to
 *     the key after `s` published its undo entry before changing the table, so an entry read
 *     after such a change is always followed by finding the undo entry.
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
final class LiveState(val prefixOf: Option[Array[Byte] => Key], initialVersion: Long, expectedKeys: Int = 16) {
  val table = new EntryTable(expectedKeys)
  private val undo = new ConcurrentSkipListMap[java.lang.Long, JHashMap[Key, Array[Byte]]]()
  private val byPrefix: Option[JHashMap[Key, JHashSet[Key]]] =
    prefixOf.map(_ => new JHashMap[Key, JHashSet[Key]]())

  @volatile var version: Long = initialVersion
  @volatile private var liveBytes = 0L
  @volatile private var undoBytes = 0L

  def numKeys: Long = table.size
  def memoryBytes: Long = liveBytes + undoBytes + table.tableBytes
  def contains(key: Key): Boolean = table.get(key) != null
  /** The entry of the key `length` bytes at `base`/`offset` (hashing to `hash`), or null. */
  def get(base: AnyRef, offset: Long, length: Int, hash: Int): Array[Byte] = table.get(base, offset, length, hash)
  def get(key: Key): Array[Byte] = table.get(key)

  /** Loads an entry read from a file (single-threaded, before publication). */
  def loadEntry(entry: Array[Byte]): Unit = store(entry, Entry.keyHash(entry))

  /** Loads a journal's delete record (single-threaded, before publication). */
  def loadDelete(key: Array[Byte]): Unit =
    remove(key, Key.hash(key, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET, key.length))

  /**
   * Commits `changes` as version `version + 1`: publish the undo entry, then change the map.
   * `keepUndoAbove`: undo entries at or below this version may be dropped afterwards.
   */
  def applyCommit(changes: ChangeSet, keepUndoAbove: Long): Unit = {
    val newVersion = version + 1
    val fromEmpty = table.size == 0
    val entry = if (fromEmpty) LiveState.FromEmpty else new JHashMap[Key, Array[Byte]](math.max(16, changes.size * 4 / 3 + 1))
    var entryBytes = 0L
    if (!fromEmpty) changes.foreach { (key, _) =>
      val prior = table.get(key)
      val recorded = if (prior == null) Tombstone.bytes else prior
      entry.put(key, recorded)
      entryBytes += MemoryModel.undoEntry(recorded)
    }
    undo.put(newVersion, entry) // published before any change to `table`
    undoBytes += entryBytes
    changes.foreach { (key, changed) => // the change set's own entries go into the table, uncopied
      if (Tombstone.is(changed)) remove(key.bytes, key.hashCode) else store(changed, key.hashCode)
    }
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
      if (entry eq LiveState.FromEmpty) {
        table.clear(); byPrefix.foreach(_.clear()); liveBytes = 0
      }
      entry.forEach { (key, prior) =>
        if (Tombstone.is(prior)) remove(key.bytes, key.hashCode) else store(prior, key.hashCode)
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

  /** Stores `entry` (its key hashing to `hash`) in the table, and its key in the prefix index. */
  private def store(entry: Array[Byte], hash: Int): Unit = {
    val previous = table.put(entry, hash)
    if (previous != null) liveBytes -= MemoryModel.liveEntry(previous)
    liveBytes += MemoryModel.liveEntry(entry)
    if (previous == null) byPrefix.foreach { index =>
      val key = new Key(Entry.key(entry), hash)
      index.computeIfAbsent(prefixOf.get(key.bytes), _ => new JHashSet[Key]()).add(key)
      liveBytes += MemoryModel.prefixMember
    }
  }

  /** Removes `key` (hashing to `hash`) from the table and the prefix index. */
  private def remove(key: Array[Byte], hash: Int): Unit = {
    val previous = table.remove(key, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET, key.length, hash)
    if (previous != null) {
      liveBytes -= MemoryModel.liveEntry(previous)
      byPrefix.foreach { index =>
        val prefix = prefixOf.get(key)
        val set = index.get(prefix)
        if (set != null) { set.remove(new Key(key, hash)); if (set.isEmpty) index.remove(prefix) }
        liveBytes -= MemoryModel.prefixMember
      }
    }
  }

  /** The live keys that share `prefix` (task thread only; the table does not move during a batch). */
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
  def writeSnapshotView(s: Long, emit: Array[Byte] => Unit): Unit = {
    val later = undo.tailMap(s, false)
    def changedAfterS(entry: Array[Byte]): Boolean = !later.isEmpty && {
      val probe = new EntryKeyProbe(entry)
      val it = later.values().iterator()
      var found = false
      while (!found && it.hasNext) { val u = it.next(); found = (u eq LiveState.FromEmpty) || u.containsKey(probe) }
      found
    }
    // The entry is taken first, then the undo log is consulted (see the class comment).
    table.foreach(entry => if (!changedAfterS(entry)) emit(entry))
    val seen = new JHashSet[Key]()
    val it = later.values().iterator()
    var emptied = false // past a FromEmpty marker, every key first seen was absent at `s`
    while (it.hasNext && !emptied) {
      val u = it.next()
      if (u eq LiveState.FromEmpty) emptied = true
      else u.forEach { (key, prior) => if (seen.add(key) && !Tombstone.is(prior)) emit(prior) }
    }
  }
}

object LiveState {
  /** The undo entry of a version committed on top of an empty state: step back by clearing. */
  private val FromEmpty = new JHashMap[Key, Array[Byte]](1)
}
