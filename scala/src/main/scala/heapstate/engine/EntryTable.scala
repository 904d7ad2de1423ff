package heapstate.engine

import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.array.ByteArrayMethods

/**
 * The live state's storage: an open-addressing hash table (linear probing) whose every entry is
 * one immutable byte array holding a key row and its value row (see [[Entry]]). A key costs one
 * array (its rows plus 20 bytes) and two table slots; there is no node, boxed key or separate
 * value object per key, which is what keeps heap per key and GC work low at millions of keys.
 *
 * == One writer, concurrent readers ==
 * One thread at a time writes (the task thread committing, or a reload). One other thread may
 * iterate concurrently ([[LiveState.writeSnapshotView]]); it needs to see, for every key, either
 * some value the key has had since iteration began or the key's absence, never a torn or
 * foreign entry, and no key twice. That holds because:
 *  - entries are never mutated: an update stores a new array into the key's slot, and a
 *    reference store is atomic;
 *  - a removal leaves the [[Deleted]] marker in its slot, so no entry ever moves to another slot
 *    of the same array (backward-shift deletion would, and an iterator could miss it);
 *  - a key put back after a removal takes the lowest-indexed removed slot of its chain, at or
 *    below its old one, so an iterator that saw it in its old slot does not meet it again;
 *  - a resize builds new arrays and publishes them through a volatile field; an iterator keeps
 *    the arrays it started with, which the writer no longer changes.
 * Readers that must know whether a key changed after some version consult the undo log, which
 * the writer publishes before touching this table.
 */
final class EntryTable(expectedKeys: Int = 16) {
  import EntryTable._

  /** Slots: the entry, [[Deleted]], or null (never used). Replaced whole on resize. */
  @volatile private var entries: Array[Array[Byte]] = new Array(capacityFor(expectedKeys))
  /** Each used slot's key hash, to skip most mismatches without touching the entry. */
  private var hashes: Array[Int] = new Array(entries.length)
  private var live = 0
  /** Slots holding an entry or [[Deleted]]; probing ends only at a null slot. */
  private var used = 0
  /** Counts the replacements of the arrays; see [[stamp]]. */
  private var generation = 0

  def size: Int = live
  def capacity: Int = entries.length

  /** The entry whose key is `length` bytes at `base`/`offset`, or null. */
  def get(base: AnyRef, offset: Long, length: Int, hash: Int): Array[Byte] = {
    val es = entries
    val i = find(es, hashes, base, offset, length, hash)
    if (i < 0) null else es(i)
  }

  def get(key: Key): Array[Byte] = get(key.bytes, Platform.BYTE_ARRAY_OFFSET, key.bytes.length, key.hashCode)

  /** The entry of the key that `entry` holds (hashing to `hash`), or null. */
  def getKeyOf(entry: Array[Byte], hash: Int): Array[Byte] =
    get(entry, Platform.BYTE_ARRAY_OFFSET + Entry.keyStart, Entry.keyLength(entry), hash)

  /**
   * The slot holding `key`'s entry, or -1. The slot stays the key's for as long as [[stamp]] does
   * not change and the key is not removed: entries never move within one set of arrays.
   */
  def slotOf(key: Key): Int = find(entries, hashes, key.bytes, Platform.BYTE_ARRAY_OFFSET, key.bytes.length, key.hashCode)

  /** The slot of `es` (with key hashes `hs`) holding the key `length` bytes at `base`/`offset`, or -1. */
  private def find(es: Array[Array[Byte]], hs: Array[Int], base: AnyRef, offset: Long, length: Int, hash: Int): Int = {
    val mask = es.length - 1
    var i = hash & mask
    var e = es(i)
    while (e != null) {
      if ((e ne Deleted) && hs(i) == hash && Entry.keyEquals(e, base, offset, length)) return i
      i = (i + 1) & mask
      e = es(i)
    }
    -1
  }

  /** The entry in `slot` (from [[slotOf]], under the same [[stamp]]). */
  def entryAt(slot: Int): Array[Byte] = entries(slot)

  /** Changes whenever the table's arrays are replaced (a resize or a clear), which moves entries to other slots. */
  def stamp: Int = generation

  /**
   * Puts `entry` in `slot` (from [[slotOf]] under `stamp`) in place of `expected`, the entry found
   * there, without probing. Returns false, changing nothing, when the arrays were replaced since
   * or the slot holds something else: the caller then falls back to [[put]].
   */
  def replaceAt(slot: Int, stamp: Int, expected: Array[Byte], entry: Array[Byte]): Boolean = {
    val es = entries
    if (stamp != generation || slot < 0 || slot >= es.length || (es(slot) ne expected) || (expected eq Deleted)) false
    else { es(slot) = entry; true }
  }

  /** Stores `entry` (whose key hashes to `hash`) in place of any entry of the same key; returns the old one or null. */
  def put(entry: Array[Byte], hash: Int): Array[Byte] = {
    if (used + 1 > entries.length - (entries.length >>> 2)) resize()
    val es = entries
    val mask = es.length - 1
    var i = hash & mask
    var free = -1
    var e = es(i)
    while (e != null) {
      // Any removed slot of the chain will do; the lowest-indexed one keeps a key put back after
      // a removal from landing past its old slot, where an iterator that saw it there would see
      // it again (a chain that wraps past the array's end has its first slots at its high end).
      if (e eq Deleted) { if (free < 0 || i < free) free = i }
      else if (hashes(i) == hash && Entry.sameKey(e, entry)) { es(i) = entry; return e }
      i = (i + 1) & mask
      e = es(i)
    }
    if (free >= 0) i = free else used += 1
    hashes(i) = hash
    es(i) = entry
    live += 1
    null
  }

  /** Removes the entry of the key `length` bytes at `base`/`offset`; returns it, or null. */
  def remove(base: AnyRef, offset: Long, length: Int, hash: Int): Array[Byte] = {
    val es = entries
    val i = find(es, hashes, base, offset, length, hash)
    if (i < 0) null
    else {
      val e = es(i)
      es(i) = Deleted
      live -= 1
      e
    }
  }

  def remove(key: Key): Array[Byte] = remove(key.bytes, Platform.BYTE_ARRAY_OFFSET, key.bytes.length, key.hashCode)

  /**
   * Calls `f` with every entry. Safe while one writer works (see the class comment): a key
   * changed meanwhile is seen with one of its values, or not at all if removed.
   */
  def foreach(f: Array[Byte] => Unit): Unit = {
    val es = entries
    var i = 0
    while (i < es.length) {
      val e = es(i)
      if (e != null && (e ne Deleted)) f(e)
      i += 1
    }
  }

  /** An iterator over the entries, with the same guarantees as [[foreach]]. */
  def iterator: Iterator[Array[Byte]] = new Iterator[Array[Byte]] {
    private val es = entries
    private var i = -1
    private def advance(): Unit = {
      i += 1
      while (i < es.length && (es(i) == null || (es(i) eq Deleted))) i += 1
    }
    advance()
    override def hasNext: Boolean = i < es.length
    override def next(): Array[Byte] = {
      if (!hasNext) throw new NoSuchElementException
      val e = es(i); advance(); e
    }
  }

  /** Empties the table (the caller excludes concurrent iterators). */
  def clear(): Unit = {
    hashes = new Array(16); live = 0; used = 0
    generation += 1
    entries = new Array(16)
  }

  /** Heap held by the table's own arrays (entries are counted by their owners). */
  def tableBytes: Long = 2L * (16 + 4L * entries.length)

  /** Rehashes into fresh arrays, dropping [[Deleted]] markers; doubles when more than half full. */
  private def resize(): Unit = {
    val old = entries
    val oldHashes = hashes
    val newCapacity = if (live + 1 > old.length / 2) old.length * 2 else old.length
    val es = new Array[Array[Byte]](newCapacity)
    val hs = new Array[Int](newCapacity)
    val mask = newCapacity - 1
    var j = 0
    while (j < old.length) {
      val e = old(j)
      if (e != null && (e ne Deleted)) {
        var i = oldHashes(j) & mask
        while (es(i) != null) i = (i + 1) & mask
        es(i) = e
        hs(i) = oldHashes(j)
      }
      j += 1
    }
    hashes = hs
    used = live
    generation += 1
    entries = es // published last: a concurrent iterator sees the old arrays or the complete new ones
  }
}

object EntryTable {
  /** The marker of a removed key's slot. */
  val Deleted: Array[Byte] = new Array[Byte](0)

  /** A power of two with room for `keys` at a load of at most one half. */
  def capacityFor(keys: Int): Int = {
    val want = math.max(16L, keys.toLong * 2)
    if (want >= (1 << 30)) 1 << 30 else Integer.highestOneBit((want - 1).toInt) << 1
  }
}

/**
 * One key and its value in a single array: `[key length: i32][key bytes][value bytes]`, where
 * the key and value bytes are `UnsafeRow`s. Entries are immutable once built.
 */
object Entry {
  private val Base = Platform.BYTE_ARRAY_OFFSET
  val HeaderBytes = 4

  def apply(key: Array[Byte], value: Array[Byte]): Array[Byte] =
    copyOf(key, value, Platform.BYTE_ARRAY_OFFSET, value.length)

  /** An entry of `key` and the `valueLength` bytes at `valueBase`/`valueOffset` (an `UnsafeRow`'s). */
  def copyOf(key: Array[Byte], valueBase: AnyRef, valueOffset: Long, valueLength: Int): Array[Byte] = {
    val e = new Array[Byte](HeaderBytes + key.length + valueLength)
    Platform.putInt(e, Base, key.length)
    System.arraycopy(key, 0, e, HeaderBytes, key.length)
    Platform.copyMemory(valueBase, valueOffset, e, Base + HeaderBytes + key.length, valueLength)
    e
  }

  def keyLength(e: Array[Byte]): Int = Platform.getInt(e, Base)
  /** Offset of the key bytes from the array's start (add `Platform.BYTE_ARRAY_OFFSET` for Unsafe). */
  def keyStart: Int = HeaderBytes
  def valueStart(e: Array[Byte]): Int = HeaderBytes + keyLength(e)
  def valueLength(e: Array[Byte]): Int = e.length - HeaderBytes - keyLength(e)

  def key(e: Array[Byte]): Array[Byte] = java.util.Arrays.copyOfRange(e, HeaderBytes, valueStart(e))
  def value(e: Array[Byte]): Array[Byte] = java.util.Arrays.copyOfRange(e, valueStart(e), e.length)

  def keyHash(e: Array[Byte]): Int = Key.hash(e, Base + HeaderBytes, keyLength(e))

  def keyEquals(e: Array[Byte], base: AnyRef, offset: Long, length: Int): Boolean =
    keyLength(e) == length && ByteArrayMethods.arrayEquals(e, Base + HeaderBytes, base, offset, length)

  def sameKey(a: Array[Byte], b: Array[Byte]): Boolean = keyEquals(a, b, Base + HeaderBytes, keyLength(b))

  /** Whether `e`'s key equals `key`. */
  def hasKey(e: Array[Byte], key: Key): Boolean = keyEquals(e, key.bytes, Base, key.bytes.length)
}

/**
 * A look-up key that points at an entry's key bytes, for hash maps keyed by [[Key]] (the change
 * set, the keys deleted above a loading snapshot). Like [[KeyProbe]], it is only ever the
 * argument of a look-up.
 */
final class EntryKeyProbe(val entry: Array[Byte], override val hashCode: Int) {
  def this(entry: Array[Byte]) = this(entry, Entry.keyHash(entry))
  override def equals(other: Any): Boolean = other match {
    case k: Key => k.hashCode == hashCode && Entry.hasKey(entry, k)
    case _ => false
  }
}
