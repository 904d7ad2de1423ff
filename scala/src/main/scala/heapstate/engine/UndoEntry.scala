package heapstate.engine

import org.apache.spark.unsafe.Platform

/**
 * One version's undo entry (see [[LiveState]]): for every key the version changed, the key's entry
 * before the version, or the fact that the key was absent.
 *
 * It is a small open-addressing table of entry arrays, with no key object, key copy or map node
 * per key (a `HashMap[Key, ...]` kept all three alive): a record costs two slots (a reference and
 * a hash) and keeps its prior entry alive, a copy (the live table drops the pages of old entries). Undo entries are kept for every version above a
 * snapshot being written, and young collections copy each of their objects until they are old.
 * A key that was absent is recorded with the entry the version stored for it, which carries the
 * key's bytes, and a bit that says "absent". A key absent both before and after the version (a
 * delete of a key that was not there) needs no undo and is not recorded.
 *
 * The committing thread fills it before publishing it ([[LiveState.applyCommit]]), and nothing
 * changes it after: snapshot views read it without a lock.
 */
final class UndoEntry private (capacity: Int) {
  /** Per slot: the key's prior entry, or, when [[absent]] has the slot, the entry carrying its key. */
  private val entries = new Array[Array[Byte]](capacity)
  private val hashes = new Array[Int](capacity)
  private val absent = new java.util.BitSet(capacity)
  private var records = 0

  /**
   * Records a changed key, hashing to `hash`: `prior` is its entry before the version, or null when
   * it was absent; `stored` is the entry the version stores for it, or [[Tombstone]]. Only the
   * committing thread calls this, before the entry is published. Each key is recorded once.
   */
  private[engine] def record(prior: Array[Byte], stored: Array[Byte], hash: Int): Unit =
    if (prior != null || !Tombstone.is(stored)) {
      require(records < capacity / 2, s"an undo entry sized for ${capacity / 2} keys got more")
      val mask = capacity - 1
      var i = hash & mask
      while (entries(i) != null) i = (i + 1) & mask
      if (prior != null) entries(i) = prior
      else { entries(i) = stored; absent.set(i) }
      hashes(i) = hash
      records += 1
    }

  /** Whether a key `length` bytes at `base`/`offset`, hashing to `hash`, is recorded. */
  def contains(base: AnyRef, offset: Long, length: Int, hash: Int): Boolean = {
    val mask = capacity - 1
    var i = hash & mask
    var e = entries(i)
    while (e != null) {
      if (hashes(i) == hash && Entry.keyEquals(e, 0, base, offset, length)) return true
      i = (i + 1) & mask
      e = entries(i)
    }
    false
  }

  /** Whether the key of the entry at `b`/`at` (hashing to `hash`) is recorded. */
  def containsKeyOf(b: Array[Byte], at: Int, hash: Int): Boolean =
    contains(b, Platform.BYTE_ARRAY_OFFSET + Entry.keyStart(at), Entry.keyLength(b, at), hash)

  /** Whether the key of the entry array `entry` (hashing to `hash`) is recorded. */
  def containsKeyOf(entry: Array[Byte], hash: Int): Boolean = containsKeyOf(entry, 0, hash)

  /**
   * Calls `f` with every record: an entry holding the key, the key's hash, and whether the key was
   * absent before the version (then the entry only carries the key; it is not a prior value).
   */
  def foreach(f: (Array[Byte], Int, Boolean) => Unit): Unit = {
    var i = 0
    while (i < capacity) {
      val e = entries(i)
      if (e != null) f(e, hashes(i), absent.get(i))
      i += 1
    }
  }

  /** Heap counted for this entry: its arrays and the prior entries it keeps alive (see [[MemoryModel]]). */
  def recountBytes: Long = {
    var n = MemoryModel.undoTable(capacity)
    foreach((e, _, wasAbsent) => if (!wasAbsent) n += MemoryModel.liveEntry(e))
    n
  }

  private[engine] def tableBytes: Long = MemoryModel.undoTable(capacity)
}

object UndoEntry {
  /** An empty undo entry with room for `keys` records. */
  def forKeys(keys: Int): UndoEntry = new UndoEntry(EntryTable.capacityFor(math.max(1, keys)))

  /** The undo entry of a version committed on top of an empty state: step back by clearing. */
  val FromEmpty: UndoEntry = new UndoEntry(2)
}
