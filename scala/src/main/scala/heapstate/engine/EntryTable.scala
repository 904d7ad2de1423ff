package heapstate.engine

import java.lang.invoke.VarHandle

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.array.ByteArrayMethods

/**
 * The live state's storage: the entries (see [[Entry]]) packed one after another into large byte
 * arrays, the pages, and an open-addressing hash table (linear probing) of one `long` per slot
 * that holds an entry's page, its offset in the page and 21 bits of its key's hash.
 *
 * There is no object per key. A million keys are a few hundred pages and one slot array, so a
 * garbage collector's marking visits a few hundred objects where an array per key made it visit a
 * million, and a key costs its rows, an 8-byte header and about two slots.
 *
 * == Pages ==
 * Entries are appended to pages. Updating a key appends its new entry and leaves the old one
 * behind as garbage, unless the update is written in place (below). A page that holds no live
 * entry any more is dropped from the page directory. When the garbage passes
 * [[EntryTable.GarbageFraction]] of the live bytes, [[compact]] moves the live entries out of the
 * emptiest pages, some after each commit, and drops those pages. A dropped page is only forgotten
 * by the directory: a reader that still holds the array reads the bytes it held.
 *
 * == In-place updates ==
 * An update whose new entry has the same key and value lengths as the old one (a count, a sum, a
 * fixed-width string: most aggregation state) may instead write its value bytes over the old ones
 * ([[overwriteAt]]): no append, no garbage, nothing for compaction to move. The bytes of such an
 * entry then change under anyone who holds its address or its page, so the writer does this only
 * when no one does. Two kinds of holders exist: a reader running [[foreach]] and the snapshot
 * writer it feeds, which reads the entries' bytes after [[foreach]] returns; the engine writes in
 * place only while no snapshot of this state is being written (it decides under the lock that
 * starting a snapshot takes). A row that the store handed to a task for a key shows the key's
 * newest value once the task's own commit wrote that key in place. Spark's stateful operators
 * read their rows from a store before its commit, which runs once the task's output is used up,
 * and an operator that keeps a row it was handed copies it, as it must for any iterator's rows.
 * Complete-mode aggregation is the exception: it commits first and then emits every row from the
 * store's iterator, after the task's last write, so those rows hold the committed values.
 *
 * An update of the same lengths made while writing in place is not allowed is appended, and its
 * old entry's place is kept as a hole. Once writing in place is allowed again, [[fillHoles]] moves
 * each such entry back into its hole (when its slot still points to the appended copy and the
 * hole's page is still the one it was in); the pages those updates were appended to then hold
 * nothing live and go. So a state whose updates keep their lengths holds next to no garbage.
 *
 * A small state's pages are small (from 4 KiB). A large state's are one G1 heap region each
 * ([[EntryTable.PageBytes]]): humongous objects, which G1 allocates among the old objects, so that
 * young collections never copy them. An entry longer than [[EntryTable.LargeEntry]] gets a page of
 * its own.
 *
 * == One writer, concurrent readers ==
 * One thread at a time writes (the task thread committing, or a reload). One other thread may
 * iterate concurrently ([[foreach]], for [[LiveState.writeSnapshotView]]); it needs to see, for
 * every key, either some value the key has had since iteration began or the key's absence, never
 * a torn or foreign entry, and no key twice. That holds because:
 *  - a slot is one `long` (written whole on the 64-bit JVMs Spark runs on), written after a
 *    release fence that follows the bytes it points to, and read before an acquire fence;
 *  - a removal leaves a marker in its slot, so no entry ever moves to another slot of the same
 *    array (backward-shift deletion would, and an iterator could miss it);
 *  - the marker is first a vacated one, which keeps the removed entry's address: only that key
 *    may take the slot back. A key put back after a removal takes the lowest-indexed slot of its
 *    chain that it may take: its own vacated slot, or a lower one. So it lands at or below its old
 *    slot, and an iterator that saw it there does not meet it again. (Were another key to take
 *    the old slot, the key put back would land further on, where the iterator meets it twice.)
 *    The writer turns vacated markers into plain [[EntryTable.Deleted]] ones, which any key may
 *    take, only while no reader is registered, and always before it drops a page, so a vacated
 *    marker's address always points to the removed entry's bytes;
 *  - a resize builds a new slot array and publishes it through a volatile field; an iterator keeps
 *    the array it started with, which the writer no longer changes;
 *  - a page is dropped from the directory (and its index reused) only while no reader is
 *    registered, and a reader registers before it reads its first slot. Both happen under the
 *    table's lock, so a reader that registers later sees every slot moved off that page.
 * Readers that must know whether a key changed after some version consult the undo log, which
 * the writer publishes before touching this table.
 */
final class EntryTable(expectedKeys: Int = 16) {
  import EntryTable._

  /**
   * Slots: [[Empty]], [[Deleted]], an entry (a hash fragment and an address), or a vacated entry
   * (an entry's slot value with [[Vacated]] set: see the class comment). Replaced whole on resize.
   */
  @volatile private var slots: Array[Long] = new Array(capacityFor(expectedKeys))
  private var live = 0
  /** Slots holding an entry or a marker; probing ends only at an empty slot. */
  private var used = 0
  /** The slots vacated since the last [[settleVacated]] (some may hold an entry again since). */
  private var vacated = new Array[Int](64)
  private var vacatedCount = 0
  /** Counts the replacements of the slot array; see [[stamp]]. */
  private var generation = 0

  /** The page directory; an address's page index points into it. Grows by copying. */
  @volatile private var pages: Array[Array[Byte]] = new Array(16)
  /** Per page: the bytes appended to it (0 once it is emptied), and those of its live entries. */
  private var pageUsed: Array[Int] = new Array(16)
  private var pageLive: Array[Int] = new Array(16)
  /** Per page index: how many pages it has held, so that a hole recorded in one is not taken for one in the next. */
  private var pageEpoch: Array[Int] = new Array(16)
  /** Page indices handed out so far; those below it are in use, emptied, or in `freeIndices`. */
  private var pageCount = 0
  private var freeIndices = new Array[Int](16)
  private var freeCount = 0
  /** Pages emptied while a reader was registered: dropped once none is. */
  private var retired = new Array[Int](16)
  private var retiredCount = 0
  /** The page entries are appended to, or -1. */
  private var current = -1
  /** The page entries that leave a hole are appended to (see [[fillHoles]]), or -1. */
  private var holePage = -1
  /** Bytes of the live entries; bytes appended to pages not emptied yet; lengths of all pages held. */
  private var liveBytes, usedBytes, heldBytes = 0L
  /** Bytes appended since the last [[compact]]: the next one moves a multiple of it at most. */
  private var appendedSinceCompaction = 0L
  /** [[evacuate]]'s list of a page's entries: their offsets and their keys' hashes. */
  private var scratchAt, scratchHash = new Array[Int](256)
  /** Where [[evacuate]] and [[readAhead]] leave what they read ahead, so that the compiler keeps those reads. */
  private var readAheadSum = 0L
  /**
   * [[readAhead]]'s first slots, read before the entries they point to: of at most
   * [[EntryTable.ReadAheadKeys]] keys a call, so that no call grows it. A commit reads ahead in its
   * look-up loop (`LiveState.lookUpChanges`, under [[LiveState.prepareCommit]]), and growing this
   * array was a branch that a JVM warmed up on small commits had not seen: at the first larger
   * commit the JIT threw the loop's compiled code away, and the commits after it ran it in a slower
   * tier (stop 75).
   */
  private val scratchSlots = new Array[Long](EntryTable.ReadAheadKeys)
  /**
   * Holes: same-length updates that [[replaceAt]] appended (while updates could not be written in
   * place), each as the slot and slot-array stamp it was made in, the address it appended, and
   * the address of the old entry it left dead (with that page's epoch). [[fillHoles]] moves them
   * back; at most [[EntryTable.MaxHoles]] are kept, the rest is left to [[compact]].
   */
  private var holeCount = 0
  private var holeSlot, holeStamp, holeEpoch = new Array[Int](0)
  private var holeFrom, holeTo = new Array[Long](0)
  /** Registered readers ([[foreach]]); guarded by the table's lock. */
  private var readers = 0
  /** Counts the pages dropped from the directory: an [[iterator]] fails when it changes. */
  @volatile private var drops = 0

  def size: Int = live
  def capacity: Int = slots.length

  /** Changes whenever the slot array is replaced (a resize or a clear), which moves entries to other slots. */
  def stamp: Int = generation

  // ---- look-ups (the writer's thread, or a reader that holds no slot across a change) ----

  /** The address of the entry whose key is `length` bytes at `base`/`offset` (hashing to `hash`), or [[NoEntry]]. */
  def find(base: AnyRef, offset: Long, length: Int, hash: Int): Long = {
    val ss = slots
    val i = findSlot(ss, base, offset, length, hash)
    if (i < 0) NoEntry else ss(i) & AddressMask
  }

  def find(key: Key): Long = find(key.bytes, Platform.BYTE_ARRAY_OFFSET, key.bytes.length, key.hashCode)

  /**
   * [[find]], then points `row` at the found entry's value, with the checks of [[pageOf]];
   * false, leaving `row` as it was, when no entry has the key. It is a store's get in one step:
   * each load a get makes counts, since the loads of successive gets that wait on their cache
   * misses together fill the processor's queues (see `HeapStore.get`).
   */
  def pointToValue(base: AnyRef, offset: Long, length: Int, hash: Int, row: UnsafeRow): Boolean = {
    val ss = slots
    val i = findSlot(ss, base, offset, length, hash)
    i >= 0 && {
      val s = ss(i)
      val page = pages(pageIndex(s))
      val at = offsetOf(s)
      if (page == null || at.toLong + Entry.HeaderBytes + length > page.length) throw changedUnderReader
      val valueAt = at + Entry.HeaderBytes + length // findSlot matched the key's length
      val valueLength = Platform.getInt(page, Platform.BYTE_ARRAY_OFFSET + at + 4)
      if (valueLength < 0 || valueAt.toLong + valueLength > page.length) throw changedUnderReader
      row.pointTo(page, Platform.BYTE_ARRAY_OFFSET + valueAt, valueLength)
      true
    }
  }

  /** The address of the entry of the key that the entry array `entry` holds (hashing to `hash`), or [[NoEntry]]. */
  def findKeyOf(entry: Array[Byte], hash: Int): Long =
    find(entry, Platform.BYTE_ARRAY_OFFSET + Entry.HeaderBytes, Entry.keyLength(entry, 0), hash)

  /**
   * The page that holds the entry at `address` (from this table, with no change since). It checks
   * that the entry lies within the page: a reader on another thread than the writer's (a second
   * task on one store, which the table does not support) may hold an address whose page was
   * dropped since, and gets an exception rather than rows that point past an array. (An entry a
   * commit writes in place, or moves back into its hole, changes under such a reader with no
   * exception: it reads the new bytes, or a mix of old and new.)
   */
  def pageOf(address: Long): Array[Byte] = {
    val page = pages(pageIndex(address))
    val at = offsetOf(address)
    if (page == null || !fits(page, at)) throw changedUnderReader
    page
  }

  /** Whether an entry's header and both its lengths at `at` lie within `page` (see [[pageOf]]). */
  private def fits(page: Array[Byte], at: Int): Boolean =
    at >= 0 && at.toLong + Entry.HeaderBytes <= page.length && {
      val keyLength = Entry.keyLength(page, at)
      val valueLength = Entry.valueLength(page, at)
      keyLength >= 0 && valueLength >= 0 && at.toLong + Entry.HeaderBytes + keyLength + valueLength <= page.length
    }

  /** The index in its page of the first byte of the entry at `address`. */
  def offsetOf(address: Long): Int = (address & OffsetMask).toInt

  /** The length of the entry at `address`, its header included. */
  private def lengthAt(address: Long): Int = Entry.length(pageOf(address), offsetOf(address))

  /** A new array holding a copy of the entry at `address`. */
  def copyOf(address: Long): Array[Byte] = {
    val page = pageOf(address)
    val offset = offsetOf(address)
    java.util.Arrays.copyOfRange(page, offset, offset + Entry.length(page, offset))
  }

  /**
   * The slot holding `key`'s entry, or -1. The slot stays the key's for as long as [[stamp]] does
   * not change and the key is not removed: entries never move to another slot of one array.
   */
  def slotOf(key: Key): Int = findSlot(slots, key.bytes, Platform.BYTE_ARRAY_OFFSET, key.bytes.length, key.hashCode)

  /** The address of the entry in `slot` (from [[slotOf]], under the same [[stamp]]). */
  def addressAt(slot: Int): Long = slots(slot) & AddressMask

  /**
   * Reads, for each of `keys(from until until)`, the first slot its probe reads and the head of
   * the entry that slot points to, without comparing keys: [[slotOf]] then finds both in the
   * caches. Each is a cache miss in a table of millions of keys (a TLB miss too, at 4M keys), and a
   * probe makes them one after the other; here the reads of different keys do not wait for each
   * other, so the core has many misses in flight at once (Java has no prefetch instruction).
   * Reads ahead for the first [[EntryTable.ReadAheadKeys]] of them at most.
   */
  def readAhead(keys: Array[Key], from: Int, until: Int): Unit = {
    val ss = slots
    val mask = ss.length - 1
    val ps = pages
    val first = scratchSlots
    val n = math.min(until - from, first.length)
    var j = 0
    while (j < n) { first(j) = ss(keys(from + j).hashCode & mask); j += 1 }
    var sum = 0L
    j = 0
    while (j < n) {
      val s = first(j)
      if (holdsEntry(s)) {
        val page = ps(pageIndex(s))
        if (page != null) sum += Platform.getInt(page, Platform.BYTE_ARRAY_OFFSET + offsetOf(s))
      }
      j += 1
    }
    readAheadSum += sum
  }

  /**
   * The slot of `ss` holding the key `length` bytes at `base`/`offset`, or -1. The comparison of a
   * candidate's key is [[holdsKey]] written out, and its bytes are compared in the loop here rather
   * than by a call: every get's look-up runs this, and the JIT inlined neither `holdsKey` nor a
   * method comparing the bytes into it, since the probes of puts of new keys (a state's load) leave
   * a profile in which the comparison is rarely reached. Stop 68, `bench/.../GetPath.scala`, random
   * gets of 1M keys through the live state: 4,900 a ms with the calls, 5,500 without (see
   * docs/PERFORMANCE_HISTORY.md).
   *
   * A slot with the key's tag and another key is rare, and the JIT compiles the loop without that
   * case: when one comes (W5's batches of 10,000 look-ups meet a few), it throws away the compiled
   * code of the caller that inlined this (a commit's look-up loop, a get) until it has counted it
   * again. A version that compared a tagged candidate whole and tested the result once, a branch
   * taken both ways, avoided that but cost the store's get a third (`GetPath`, 1M keys, four JVMs
   * of each taking turns: 2,846 to 3,264 gets a ms against 4,687 to 5,012; stop 75), so the
   * comparison stays as it is.
   */
  private def findSlot(ss: Array[Long], base: AnyRef, offset: Long, length: Int, hash: Int): Int = {
    val mask = ss.length - 1
    val tag = tagOf(hash)
    val ps = pages
    var i = hash & mask
    var s = ss(i)
    while (s != Empty) {
      if ((s >>> AddressBits) == tag && s != Deleted) {
        val page = ps(pageIndex(s))
        if (page == null) throw changedUnderReader
        val at = offsetOf(s)
        if (Platform.getInt(page, Platform.BYTE_ARRAY_OFFSET + at) == length &&
          at + Entry.HeaderBytes + length <= page.length) {
          val keyAt = Platform.BYTE_ARRAY_OFFSET + at + Entry.HeaderBytes
          var j = 0
          while (j + 8 <= length && Platform.getLong(page, keyAt + j) == Platform.getLong(base, offset + j)) j += 8
          while (j < length && Platform.getByte(page, keyAt + j) == Platform.getByte(base, offset + j)) j += 1
          if (j == length) return i
        }
      }
      i = (i + 1) & mask
      s = ss(i)
    }
    -1
  }

  /**
   * Whether the entry slot `s` points to (in directory `ps`) has the key `length` bytes at
   * `base`/`offset`: `Entry.keyEquals` with the check of [[pageOf]], for the probes of puts
   * (a look-up's, in [[findSlot]], is written out there).
   */
  private def holdsKey(ps: Array[Array[Byte]], s: Long, base: AnyRef, offset: Long, length: Int): Boolean = {
    val page = ps(pageIndex(s))
    if (page == null) throw changedUnderReader
    val at = offsetOf(s)
    val lengthMatches = Platform.getInt(page, Platform.BYTE_ARRAY_OFFSET + at) == length
    lengthMatches && at + Entry.HeaderBytes + length <= page.length &&
    Key.sameBytes(page, Platform.BYTE_ARRAY_OFFSET + at + Entry.HeaderBytes, base, offset, length)
  }

  // ---- changes (the writer's thread) ----

  /**
   * Puts a copy of the entry array `entry` in `slot` (from [[slotOf]] under `stamp`) in place of
   * the entry at `expected`, without probing. Returns false, changing nothing, when the slot array
   * was replaced since or the slot holds something else: the caller then falls back to [[put]].
   * A new entry of the old one's lengths is appended too (an update made while a snapshot is
   * written), and the old entry's place is kept as a hole for [[fillHoles]].
   */
  def replaceAt(slot: Int, stamp: Int, expected: Long, entry: Array[Byte]): Boolean =
    stillAt(slot, stamp, expected) && {
      val ss = slots
      val length = lengthAt(expected)
      // The same key and length: the same lengths, so the old entry's place is kept as a hole.
      val hole = length == entry.length && holeCount < MaxHoles
      // An entry array is laid out as in a page.
      val moved = append(entry, Platform.BYTE_ARRAY_OFFSET, entry.length, hole)
      // The new entry is published before the old one can be dropped.
      setSlot(ss, slot, (ss(slot) & ~AddressMask) | moved)
      if (hole) keepHole(slot, moved, expected)
      release(expected, length)
      true
    }

  /** Whether `slot` (from [[slotOf]] under `stamp`) still holds the entry at `expected`. */
  private def stillAt(slot: Int, stamp: Int, expected: Long): Boolean = {
    val ss = slots
    stamp == generation && slot >= 0 && slot < ss.length && expected != NoEntry && {
      val s = ss(slot)
      holdsEntry(s) && (s & AddressMask) == expected
    }
  }

  /**
   * Writes the value of the entry array `entry` over the value of the entry at `expected`, in
   * `slot` (from [[slotOf]] under `stamp`), when the two entries have the same key and value
   * lengths: nothing is appended and nothing is left behind as garbage. Returns false, changing
   * nothing, when the lengths differ, the slot array was replaced since, or the slot holds
   * something else: the caller then falls back to [[replaceAt]].
   *
   * Only for a writer that knows no reader holds an address or a page of this table: no
   * [[foreach]] is running and no snapshot writer still reads bytes it was handed (see "In-place
   * updates" in the class comment). The writer's thread.
   */
  def overwriteAt(slot: Int, stamp: Int, expected: Long, entry: Array[Byte]): Boolean =
    stillAt(slot, stamp, expected) && {
      val page = pageOf(expected)
      val at = offsetOf(expected)
      Entry.sameLengths(page, at, entry, 0) && {
        // The key bytes are the same (the slot holds this key), and so is the header.
        val from = Entry.HeaderBytes + Entry.keyLength(entry, 0)
        System.arraycopy(entry, from, page, at + from, entry.length - from)
        true
      }
    }

  /**
   * Stores a copy of the entry array `entry` (whose key hashes to `hash`) in place of any entry of
   * the same key; returns the replaced entry's length in bytes, or -1 when the key was absent.
   */
  def put(entry: Array[Byte], hash: Int): Int = {
    val keyLength = Entry.keyLength(entry, 0)
    put(entry, Entry.HeaderBytes, keyLength, Entry.HeaderBytes + keyLength,
      entry.length - Entry.HeaderBytes - keyLength, hash)
  }

  /**
   * [[put]] of the entry whose key is `keyLength` bytes at index `keyAt` of `src` and whose value is
   * `valueLength` bytes at `valueAt` (a record of a decompressed snapshot bucket, say).
   */
  def put(src: Array[Byte], keyAt: Int, keyLength: Int, valueAt: Int, valueLength: Int, hash: Int): Int = {
    if (used + 1 > mostUsed(slots.length)) resize()
    val ss = slots
    val mask = ss.length - 1
    val tag = tagOf(hash)
    var i = hash & mask
    var free = -1
    var s = ss(i)
    while (s != Empty) {
      // Any Deleted slot of the chain will do, and a slot this key was removed from; the
      // lowest-indexed one keeps a key put back after a removal from landing past its old slot,
      // where an iterator that saw it there would see it again (a chain that wraps past the
      // array's end has its first slots at its high end). Another key's vacated slot will not do.
      if (s <= Deleted) {
        if ((s == Deleted || vacatedBy(s, tag, src, keyAt, keyLength)) && (free < 0 || i < free)) free = i
      } else if ((s >>> AddressBits) == tag && holdsKey(pages, s, src, Platform.BYTE_ARRAY_OFFSET + keyAt, keyLength))
        return replaceIn(ss, i, src, keyAt, keyLength, valueAt, valueLength)
      i = (i + 1) & mask
      s = ss(i)
    }
    val address = appendParts(src, keyAt, keyLength, valueAt, valueLength)
    if (free >= 0) i = free else used += 1
    setSlot(ss, i, (tag << AddressBits) | address)
    live += 1
    -1
  }

  /** [[put]]'s update of the key in `ss(i)`: appends the new entry, points the slot to it, and returns the old one's length. */
  private def replaceIn(ss: Array[Long], i: Int, src: Array[Byte], keyAt: Int, keyLength: Int, valueAt: Int,
      valueLength: Int): Int = {
    val s = ss(i)
    val old = s & AddressMask
    val length = lengthAt(old)
    val moved = appendParts(src, keyAt, keyLength, valueAt, valueLength)
    setSlot(ss, i, (s & ~AddressMask) | moved)
    release(old, length)
    length
  }

  /**
   * Whether the vacated slot value `s` held the entry of the key `keyLength` bytes at `keyAt` of
   * `src` (with hash tag `tag`): the one key that may take it back before it settles. Its address
   * still holds the removed entry (see the class comment). This and [[replaceIn]] are apart from
   * [[put]] so that the JIT still inlines it into its callers: its bytecode stays under HotSpot's
   * 325-byte limit for hot methods (with both inside it was 370 bytes; before vacated slots, 300).
   */
  private def vacatedBy(s: Long, tag: Long, src: Array[Byte], keyAt: Int, keyLength: Int): Boolean =
    (s >>> AddressBits) == (tag | VacatedTag) && {
      pageOf(s & AddressMask) // an exception, not a read past an array, were a vacated address ever stale
      holdsKey(pages, s, src, Platform.BYTE_ARRAY_OFFSET + keyAt, keyLength)
    }

  /** Removes the entry of the key `length` bytes at `base`/`offset`; returns its length in bytes, or -1. */
  def remove(base: AnyRef, offset: Long, length: Int, hash: Int): Int = {
    val ss = slots
    val i = findSlot(ss, base, offset, length, hash)
    if (i < 0) -1
    else {
      val old = ss(i) & AddressMask
      val entryLength = lengthAt(old)
      vacate(ss, i)
      live -= 1
      release(old, entryLength)
      entryLength
    }
  }

  /** Marks `ss(i)` vacated and lists it for [[settleVacated]]. */
  private def vacate(ss: Array[Long], i: Int): Unit = {
    if (vacatedCount == vacated.length) {
      settleVacated()
      if (vacatedCount == vacated.length) vacated = java.util.Arrays.copyOf(vacated, vacatedCount * 2)
    }
    vacated(vacatedCount) = i
    vacatedCount += 1
    setSlot(ss, i, ss(i) | Vacated)
  }

  def remove(key: Key): Int = remove(key.bytes, Platform.BYTE_ARRAY_OFFSET, key.bytes.length, key.hashCode)

  /** Empties the table (the caller excludes concurrent readers). */
  def clear(): Unit = {
    live = 0; used = 0
    pageUsed = new Array(16); pageLive = new Array(16); pageEpoch = new Array(16); pageCount = 0; freeCount = 0
    retiredCount = 0; holeCount = 0; dropHoleLists(); vacatedCount = 0
    current = -1; holePage = -1; liveBytes = 0; usedBytes = 0; heldBytes = 0; appendedSinceCompaction = 0
    generation += 1
    pages = new Array(16)
    slots = new Array(16)
    drops += 1
  }

  // ---- readers ----

  /**
   * Calls `f` with every entry's page and offset, registered as a reader (see the class comment):
   * safe while one writer works; a key changed meanwhile is seen with one of its values, or not at
   * all if removed. The bytes stay valid after `f` returns.
   *
   * Given `only`, it calls `f` with the entries whose key's bucket (of `1 << only.bits`, by the
   * key's hash: [[heapstate.io.StateFileFormat.bucketOf]]) is in `only`, and reads no other
   * entry's bytes: the slot's hash tag, the hash's highest 21 bits, names the bucket.
   */
  def foreach(f: EntryTable.EntryVisitor, only: BucketSet = null): Unit = {
    synchronized { readers += 1 }
    try {
      val ss = slots
      var i = 0
      while (i < ss.length) {
        val s = ss(i)
        VarHandle.acquireFence() // the entry's bytes are read after the slot that points to them
        if (holdsEntry(s) && (only == null || only.containsTop21((s >>> AddressBits).toInt))) {
          f(pages(pageIndex(s)), offsetOf(s))
        }
        i += 1
      }
    } finally synchronized { readers -= 1 }
  }

  /**
   * The entries' addresses, for the writer's own thread between its changes (a task iterating its
   * store). It fails if a change drops a page while it is open, rather than read a dropped page.
   */
  def iterator: Iterator[Long] = new Iterator[Long] {
    private val ss = slots
    private val dropsAtStart = drops
    private var i = -1
    private def advance(): Unit = {
      i += 1
      while (i < ss.length && !holdsEntry(ss(i))) i += 1
    }
    advance()
    override def hasNext: Boolean = i < ss.length
    override def next(): Long = {
      if (!hasNext) throw new NoSuchElementException
      if (drops != dropsAtStart)
        throw new java.util.ConcurrentModificationException("heapstate: the state changed under an iterator")
      val s = ss(i); advance(); s & AddressMask
    }
  }

  // ---- memory ----

  /** Heap held by the table: its pages (live entries, garbage and free room), slots and directory. */
  def heapBytes: Long = heldBytes + bookkeepingBytes(pages)

  /** The slot array, directory `ps` and its per-page counts, and the free, retired and vacated index lists. */
  private def bookkeepingBytes(ps: Array[Array[Byte]]): Long =
    16L + 8L * slots.length + 4 * (16L + 4L * ps.length) + 4L * (freeIndices.length + retired.length + vacated.length) +
      (4L * 3 + 8L * 2) * holeFrom.length

  /** [[heapBytes]] counted afresh from the directory; tests hold the one to the other. Writer's thread only. */
  private[heapstate] def heapBytesRecounted: Long = {
    var n = 0L
    val ps = pages
    var p = 0
    while (p < pageCount) { if (ps(p) != null) n += ps(p).length; p += 1 }
    n + bookkeepingBytes(ps)
  }

  /** Bytes of the live entries. */
  def entryBytes: Long = liveBytes

  /**
   * Checks the running counts against the slots and pages (for tests): each page's live bytes,
   * the live total, and that no slot points into a dropped page. Writer's thread only.
   */
  private[heapstate] def checkAccounts(): Unit = {
    val counted = new Array[Long](pageCount)
    var total = 0L
    var n, inUse = 0
    val ss = slots
    var i = 0
    while (i < ss.length) {
      val s = ss(i)
      if (s != Empty) inUse += 1
      if (s < 0) require(pages(pageIndex(s)) != null, s"vacated slot $i points into dropped page ${pageIndex(s)}")
      if (holdsEntry(s)) {
        val p = pageIndex(s)
        require(pages(p) != null, s"slot $i points into dropped page $p")
        val length = Entry.length(pages(p), offsetOf(s))
        require(offsetOf(s) + length <= pageUsed(p), s"slot $i points past page $p's end")
        counted(p) += length; total += length; n += 1
      }
      i += 1
    }
    require(n == live, s"$n entries in the slots, $live counted")
    require(inUse == used, s"$inUse slots in use, $used counted")
    require(total == liveBytes, s"$total live bytes in the slots, $liveBytes counted")
    var p = 0
    while (p < pageCount) {
      require(counted(p) == pageLive(p), s"page $p: ${counted(p)} live bytes in the slots, ${pageLive(p)} counted")
      p += 1
    }
  }

  // ---- the arena ----

  /**
   * Appends `length` bytes at `base`/`offset` (an entry) to the pages; returns their address. An
   * entry that leaves a hole (see [[fillHoles]]) goes to the hole page instead of the current one.
   */
  private def append(base: AnyRef, offset: Long, length: Int, hole: Boolean = false): Long = {
    val p = if (hole) holePageFor(length) else pageFor(length)
    val at = pageUsed(p)
    Platform.copyMemory(base, offset, pages(p), Platform.BYTE_ARRAY_OFFSET + at, length)
    appended(p, at, length)
  }

  /** Appends an entry of the key and value at `keyAt` and `valueAt` of `src`, with its header; returns its address. */
  private def appendParts(src: Array[Byte], keyAt: Int, keyLength: Int, valueAt: Int, valueLength: Int): Long = {
    val length = Entry.HeaderBytes + keyLength + valueLength
    val p = pageFor(length)
    val page = pages(p)
    val at = pageUsed(p)
    Platform.putInt(page, Platform.BYTE_ARRAY_OFFSET + at, keyLength)
    Platform.putInt(page, Platform.BYTE_ARRAY_OFFSET + at + 4, valueLength)
    System.arraycopy(src, keyAt, page, at + Entry.HeaderBytes, keyLength)
    System.arraycopy(src, valueAt, page, at + Entry.HeaderBytes + keyLength, valueLength)
    appended(p, at, length)
  }

  /** The page an entry of `length` bytes goes to: the current one, a new one, or one of its own. */
  private def pageFor(length: Int): Int =
    if (length > LargeEntry) newPage(length)
    else {
      if (current < 0 || pageUsed(current) + length > pages(current).length) {
        val full = current
        current = newPage(nextPageBytes(length))
        if (full >= 0 && pageLive(full) == 0) empty(full)
      }
      current
    }

  /**
   * [[pageFor]] of an entry that leaves a hole: the page such entries are appended to, apart from
   * the current page, so that it holds nothing live once they went back, and goes. Hole pages live
   * for one snapshot's length, so they are never larger than [[EntryTable.YoungPageBytes]]: G1
   * allocates them among the young objects, in memory already in use, where a humongous page
   * would take a region of its own (its first touch a page fault per 4 KiB, in every store at
   * once, as their snapshots begin).
   */
  private def holePageFor(length: Int): Int =
    if (length > LargeEntry) newPage(length)
    else {
      if (holePage < 0 || pageUsed(holePage) + length > pages(holePage).length) {
        val full = holePage
        holePage = newPage(math.max(length, math.min(nextPageBytes(length), YoungPageBytes)))
        if (full >= 0 && pageLive(full) == 0) empty(full)
      }
      holePage
    }

  /** Counts `length` bytes appended at `at` of page `p`; returns their address. */
  private def appended(p: Int, at: Int, length: Int): Long = {
    pageUsed(p) += length
    pageLive(p) += length
    liveBytes += length
    usedBytes += length
    appendedSinceCompaction += length
    addressOf(p, at)
  }

  /**
   * The size of the next page to append to: a quarter of the pages held, as a power of two
   * between [[EntryTable.MinPageBytes]] and [[EntryTable.YoungPageBytes]], so that a small state
   * holds small pages and the room not used yet stays a small share; [[EntryTable.PageBytes]] once
   * that quarter reaches it; at least `need`.
   */
  private def nextPageBytes(need: Int): Int = {
    val quarter = heldBytes / 4
    val size = if (quarter >= PageBytes && (!youngPagesOnly || heldBytes >= YoungPagesOnlyUpTo)) PageBytes
    else math.min(math.max(java.lang.Long.highestOneBit(math.max(quarter, 1L)), MinPageBytes.toLong),
      YoungPageBytes.toLong).toInt
    math.max(need, size)
  }

  /**
   * Whether new pages are young-sized whatever the state's size. A state loading a snapshot sets
   * it: each humongous allocation lets G1 start a marking cycle once the old objects pass its
   * threshold, which in a JVM that just started is low, and a load appends a whole state's pages
   * in a few batches. It gives way past [[EntryTable.YoungPagesOnlyUpTo]] of pages, so that a very
   * large state does not run out of page indices. Writer's thread only.
   */
  var youngPagesOnly = false

  /** The size of the page entries are appended to now (what a new state starts with, before any). */
  def currentPageBytes: Int = if (current < 0) MinPageBytes else pages(current).length

  /** Bytes in the pages that no live entry uses: left behind by updates and removals. */
  def garbageBytes: Long = usedBytes - liveBytes

  /** A new page of `length` bytes in the directory; returns its index. */
  private def newPage(length: Int): Int = {
    val p = if (freeCount > 0) { freeCount -= 1; freeIndices(freeCount) }
    else {
      if (pageCount == MaxPages)
        throw new IllegalStateException(s"heapstate: a state store holds at most $MaxPages pages")
      if (pageCount == pages.length) {
        val grown = math.min(pages.length * 2, MaxPages)
        pageUsed = java.util.Arrays.copyOf(pageUsed, grown)
        pageLive = java.util.Arrays.copyOf(pageLive, grown)
        pageEpoch = java.util.Arrays.copyOf(pageEpoch, grown)
        pages = java.util.Arrays.copyOf(pages, grown) // a reader sees the old directory or the whole new one
      }
      pageCount += 1
      pageCount - 1
    }
    pages(p) = new Array[Byte](length)
    pageUsed(p) = 0
    pageLive(p) = 0
    pageEpoch(p) += 1
    heldBytes += length
    p
  }

  /** Counts the entry of `length` bytes at `address` as garbage; its slot no longer points to it. */
  private def release(address: Long, length: Int): Unit = {
    val p = pageIndex(address)
    pageLive(p) -= length
    liveBytes -= length
    if (pageLive(p) == 0 && p != current && p != holePage) empty(p)
  }

  /** Takes page `p`, which holds no live entry, out of use: dropped now, or once no reader is registered. */
  private def empty(p: Int): Unit = {
    usedBytes -= pageUsed(p)
    pageUsed(p) = 0
    synchronized {
      if (retiredCount == retired.length) retired = java.util.Arrays.copyOf(retired, retiredCount * 2)
      retired(retiredCount) = p
      retiredCount += 1
      if (readers == 0) dropRetired()
    }
  }

  /**
   * Drops the retired pages from the directory (under the lock, with no reader registered), after
   * [[settleVacated]]: no vacated marker may point into a dropped page.
   */
  private def dropRetired(): Unit = {
    settleVacated()
    while (retiredCount > 0) {
      retiredCount -= 1
      val p = retired(retiredCount)
      heldBytes -= pages(p).length
      pages(p) = null
      if (freeCount == freeIndices.length) freeIndices = java.util.Arrays.copyOf(freeIndices, freeCount * 2)
      freeIndices(freeCount) = p
      freeCount += 1
    }
    drops += 1
  }

  /** Records that the entry in `slot` was appended at `from`, leaving the dead entry at `to` (see [[fillHoles]]). */
  private def keepHole(slot: Int, from: Long, to: Long): Unit = {
    if (holeCount == holeFrom.length) {
      val grown = math.min(math.max(64, holeCount * 2), MaxHoles)
      holeSlot = java.util.Arrays.copyOf(holeSlot, grown); holeStamp = java.util.Arrays.copyOf(holeStamp, grown)
      holeEpoch = java.util.Arrays.copyOf(holeEpoch, grown)
      holeFrom = java.util.Arrays.copyOf(holeFrom, grown); holeTo = java.util.Arrays.copyOf(holeTo, grown)
    }
    holeSlot(holeCount) = slot; holeStamp(holeCount) = generation; holeEpoch(holeCount) = pageEpoch(pageIndex(to))
    holeFrom(holeCount) = from; holeTo(holeCount) = to
    holeCount += 1
  }

  /**
   * Moves each entry that [[replaceAt]] appended over an entry of the same lengths back into the
   * dead entry's place, when the slot still holds it and that page is still in use; forgets every
   * hole. Those appends went to pages of their own ([[holePage]]), which then hold nothing live and
   * go: updates made while a snapshot was written cost a copy each, once it is done, and leave no
   * garbage for [[compact]] to move. A hole that is skipped (its key removed or changed since, its
   * page emptied by compaction) stays garbage, and so may the copy that could not go back.
   * Returns the bytes moved.
   *
   * Only under the same condition as [[overwriteAt]] (no reader holds an address or a page), and
   * it is what moving an entry is anyway: a live entry goes to a place of its own size that no slot
   * points to (each hole is recorded once, when its entry died, and only this fills it).
   */
  def fillHoles(): Long = {
    val ss = slots
    var moved = 0L
    // Newest first: a key updated twice left a hole, then a second one in the first's copy; the
    // second copy goes back into the first's place, and from there into the oldest hole.
    var i = holeCount - 1
    while (i >= 0) {
      val slot = holeSlot(i)
      val from = holeFrom(i)
      val to = holeTo(i)
      val p = pageIndex(to)
      // The slot still holds the appended entry, and the hole's page is the one it was in, in use.
      if (holeStamp(i) == generation && holdsEntry(ss(slot)) && (ss(slot) & AddressMask) == from &&
        pageEpoch(p) == holeEpoch(i) && pageUsed(p) > 0) {
        // Both through pageOf: an address whose page is gone is an exception, not a read past an array.
        val (src, dst) = (pageOf(from), pageOf(to))
        val (fromAt, toAt) = (offsetOf(from), offsetOf(to))
        if (Entry.sameLengths(src, fromAt, dst, toAt)) {
          val length = Entry.length(src, fromAt)
          System.arraycopy(src, fromAt, dst, toAt, length)
          pageLive(p) += length
          liveBytes += length
          setSlot(ss, slot, (ss(slot) & ~AddressMask) | to)
          release(from, length)
          moved += length
        }
      }
      i -= 1
    }
    holeCount = 0
    // The lists are for the next snapshot's updates; one snapshot's many need not stay allocated.
    if (holeFrom.length > 1024) dropHoleLists()
    // The hole page appended to last goes too once nothing in it is live; else it stays as any page.
    if (holePage >= 0) { val p = holePage; holePage = -1; if (pageLive(p) == 0) empty(p) }
    moved
  }

  private def dropHoleLists(): Unit = {
    holeSlot = new Array(0); holeStamp = new Array(0); holeEpoch = new Array(0)
    holeFrom = new Array(0); holeTo = new Array(0)
  }

  /** Holes waiting for [[fillHoles]] (tests). */
  private[heapstate] def holes: Int = holeCount

  /**
   * Moves the live entries out of the emptiest pages while the garbage is more than
   * [[EntryTable.GarbageFraction]] of the live bytes, up to [[EntryTable.CompactionRatio]] times
   * the bytes appended since the last call. Returns the bytes moved. The writer calls it after
   * each commit. It does nothing while a reader is registered: no page could be dropped then.
   */
  def compact(): Long = {
    // dropRetired settles the vacated markers first itself.
    if (synchronized { if (retiredCount > 0 && readers == 0) dropRetired() else settleVacated(); readers > 0 })
      return 0L
    // What was appended while readers kept this from running counts too, so that it catches up.
    val budget = CompactionRatio * math.max(appendedSinceCompaction, currentPageBytes.toLong)
    appendedSinceCompaction = 0
    var moved = 0L
    var done = false
    while (!done && moved < budget && garbageBytes > math.max(GarbageFraction * liveBytes.toDouble,
        4.0 * MinPageBytes)) {
      val v = victim()
      if (v < 0) done = true else moved += evacuate(v)
    }
    moved
  }

  /** Forgets the bytes appended since the last [[compact]], so that they do not raise the next one's budget. */
  def skipCompaction(): Unit = {
    appendedSinceCompaction = 0
    if (vacatedCount > 0) settleVacated()
  }

  /**
   * Turns the vacated markers into [[Deleted]] ones, which any key may take, unless a reader is
   * registered (see the class comment): the rule is kept here, under the table's lock, for every
   * caller. The writer's thread.
   */
  private def settleVacated(): Unit = synchronized {
    if (readers == 0) {
      val ss = slots
      var k = 0
      while (k < vacatedCount) {
        val i = vacated(k)
        if (ss(i) < 0) ss(i) = Deleted // else the key was put back there
        k += 1
      }
      vacatedCount = 0
      if (vacated.length > 4096) vacated = new Array(64)
    }
  }

  /** Vacated markers not yet settled (tests). */
  private[heapstate] def vacatedSlots: Int = vacatedCount

  /** The page with the smallest share of live bytes, if below [[EntryTable.MaxVictimLive]]; else -1. */
  private def victim(): Int = {
    var best = -1
    var bestLive, bestUsed = 0L
    var p = 0
    while (p < pageCount) {
      val u = pageUsed(p)
      if (u > 0 && p != current && p != holePage && (best < 0 || pageLive(p).toLong * bestUsed < bestLive * u)) {
        best = p; bestLive = pageLive(p); bestUsed = u
      }
      p += 1
    }
    if (best >= 0 && bestLive.toDouble < MaxVictimLive * bestUsed) best else -1
  }

  /** Moves page `v`'s live entries to the current page, which empties it; returns the bytes moved. */
  private def evacuate(v: Int): Long = {
    val page = pages(v)
    val end = pageUsed(v)
    // First the page's entries in order (one sequential read), then their slots: each slot is a
    // cache miss, so the slot `ReadAhead` entries on is touched while this one is moved.
    var n = 0
    var at = 0
    while (at < end) {
      if (n == scratchAt.length) {
        scratchAt = java.util.Arrays.copyOf(scratchAt, n * 2)
        scratchHash = java.util.Arrays.copyOf(scratchHash, n * 2)
      }
      scratchAt(n) = at
      scratchHash(n) = Key.hash(page, Platform.BYTE_ARRAY_OFFSET + at + Entry.HeaderBytes, Entry.keyLength(page, at))
      n += 1
      at += Entry.length(page, at)
    }
    val ss = slots // no resize while moving: only a put resizes
    val mask = ss.length - 1
    var ahead = 0L
    var moved = 0L
    var j = 0
    // Stops as soon as the page holds nothing live: emptied, its index may be reused by then.
    while (j < n && pageLive(v) > 0) {
      if (j + ReadAhead < n) ahead += ss(scratchHash(j + ReadAhead) & mask)
      val at = scratchAt(j)
      val address = addressOf(v, at)
      var i = scratchHash(j) & mask
      var s = ss(i)
      while (s != Empty && !(holdsEntry(s) && (s & AddressMask) == address)) { i = (i + 1) & mask; s = ss(i) }
      if (s != Empty) { // live: its key's slot points here
        val length = Entry.length(page, at)
        val moveTo = append(page, Platform.BYTE_ARRAY_OFFSET + at, length)
        setSlot(ss, i, (s & ~AddressMask) | moveTo)
        release(address, length)
        moved += length
      }
      j += 1
    }
    readAheadSum += ahead
    moved
  }

  /** Rehashes into a fresh slot array, dropping [[Deleted]] markers; doubles when more than half full. */
  private def resize(): Unit = {
    val length = slots.length
    rehash(if (live + 1 > length / 2) length * 2 else length)
  }

  /**
   * Makes room for `more` keys beyond those in the table, so that a commit that adds that many
   * (a query's first batch, say) rehashes once, up front, instead of at each doubling on the way:
   * a rehash reads every live entry's key again, from pages long out of the cache.
   */
  def reserve(more: Long): Unit = {
    // The capacity the puts would have grown the table to (see `put`), not a larger one.
    val keys = math.min(live + more, 1L << 29)
    var capacity = slots.length
    while (keys > mostUsed(capacity)) capacity <<= 1
    if (capacity > slots.length) rehash(capacity)
  }

  /**
   * The most slots in use (live keys and [[Deleted]] markers) that an array of `capacity` slots
   * holds before it grows: three quarters.
   */
  private def mostUsed(capacity: Int): Int = capacity - (capacity >>> 2)

  /** Rehashes into a fresh slot array of `newCapacity` slots (a power of two), dropping [[Deleted]] markers. */
  private def rehash(newCapacity: Int): Unit = {
    val old = slots
    val ss = new Array[Long](newCapacity)
    val mask = newCapacity - 1
    val ps = pages
    var j = 0
    while (j < old.length) {
      val s = old(j)
      if (holdsEntry(s)) {
        val page = ps(pageIndex(s))
        val at = offsetOf(s)
        // The slot keeps 21 bits of the hash; the index needs the low ones, so it is computed again.
        var i = Key.hash(page, Platform.BYTE_ARRAY_OFFSET + at + Entry.HeaderBytes, Entry.keyLength(page, at)) & mask
        while (ss(i) != Empty) i = (i + 1) & mask
        ss(i) = s
      }
      j += 1
    }
    used = live
    vacatedCount = 0 // the markers stay in the old array
    generation += 1
    slots = ss // published last: a concurrent reader sees the old array or the complete new one
  }

  /** Writes a slot after every write before it, as a release store does (see the class comment). */
  private def setSlot(ss: Array[Long], i: Int, value: Long): Unit = { VarHandle.releaseFence(); ss(i) = value }
}

object EntryTable {
  /** What [[EntryTable.foreach]] calls with each entry: its page and offset (primitive arguments: no boxing). */
  trait EntryVisitor {
    def apply(page: Array[Byte], at: Int): Unit
  }

  /** The address that means "no entry". */
  val NoEntry = 0L
  /**
   * Slot values: never used, and removed (once settled: see [[Vacated]]). Neither is an address (a
   * page field is at least 1).
   */
  private val Empty = 0L
  private val Deleted = 1L
  /**
   * The bit that marks an entry's slot vacated: its key was removed, and the slot still holds the
   * entry's address (see the class comment). The sign bit, so that a slot holds an entry exactly
   * when it is above [[Deleted]].
   */
  private val Vacated = 1L << 63
  private def holdsEntry(s: Long): Boolean = s > Deleted

  /** A slot: `[vacated: 1 bit][hash tag: 21 bits][page index + 1: 17 bits][offset in the page: 25 bits]`. */
  private val OffsetBits = 25
  private val PageBits = 17
  private val AddressBits = OffsetBits + PageBits
  private val OffsetMask = (1L << OffsetBits) - 1
  private val AddressMask = (1L << AddressBits) - 1
  private val MaxPages = (1 << PageBits) - 2
  /**
   * The bits of a key's hash a slot keeps, its highest: what the slot has beside the vacated bit
   * and the address. `BucketSet.containsTop21` takes them for 21.
   */
  private val TagBits = 63 - AddressBits
  require(TagBits == 21, s"a slot keeps $TagBits bits of its key's hash; BucketSet.containsTop21 reads 21")
  /** [[Vacated]] as it shows in a slot's tag field (`slot >>> AddressBits`). */
  private val VacatedTag = 1L << (63 - AddressBits)

  /** A byte array's header on a 64-bit HotSpot JVM: mark word, class pointer and length. */
  private val ArrayHeaderBytes = 16 // before PageBytes, which is initialised from it
  /** The largest page allocated among young objects: under G1's smallest humongous size (512 KiB). */
  val YoungPageBytes: Int = 256 * 1024
  /**
   * The page of a large state: under G1, one heap region less an array's header, so that each page
   * is a humongous object that fills its region exactly. A humongous object is allocated among the
   * old objects, where young collections never copy it: pages live long, and a young-sized page
   * is copied by every young collection until it is promoted. Other collectors:
   * [[YoungPageBytes]].
   */
  val PageBytes: Int = g1RegionBytes match {
    case Some(region) if region >= 2L * YoungPageBytes => math.min(region, 32L << 20).toInt - ArrayHeaderBytes
    case _ => YoungPageBytes
  }
  /** Past this many bytes of pages, [[EntryTable.youngPagesOnly]] no longer keeps pages young-sized. */
  val YoungPagesOnlyUpTo: Long = 4L << 30
  /** The smallest page (a store's first). */
  val MinPageBytes: Int = 4 * 1024
  /** An entry longer than this gets a page of its own. */
  val LargeEntry: Int = YoungPageBytes / 4
  /**
   * How many keys [[LiveState.prepareCommit]] reads ahead ([[EntryTable.readAhead]]) before it
   * looks them up one by one: the slots and entry heads of 256 keys (two 4 KiB pages each, at most)
   * stay in the L2 cache and its TLB until their look-ups come.
   */
  val ReadAheadKeys = 256

  /** G1's heap region size, when this JVM runs G1. */
  private def g1RegionBytes: Option[Long] =
    try {
      val hotspot =
        java.lang.management.ManagementFactory.getPlatformMXBean(classOf[com.sun.management.HotSpotDiagnosticMXBean])
      if (hotspot.getVMOption("UseG1GC").getValue != "true") None
      else Some(hotspot.getVMOption("G1HeapRegionSize").getValue.toLong)
    } catch { case _: Exception => None }
  /**
   * [[EntryTable.compact]] runs while the garbage is more than this share of the live bytes. W1's
   * `memoryUsedBytes` target (at most 1.2x the raw rows) leaves room for about this much, beside
   * the slots and the undo log; updates spread over every page (W1's are uniform) make compaction
   * move about 9 bytes for each byte of garbage at this share (`bench/runMain
   * heapstate.bench.ArenaChurn`).
   */
  val GarbageFraction = 0.05
  /** Pages with at least this share of live bytes are never emptied by moving their entries. */
  val MaxVictimLive = 0.95
  /** [[EntryTable.compact]] moves at most this many times the bytes appended since it last ran. */
  val CompactionRatio = 8L

  private def changedUnderReader =
    new java.util.ConcurrentModificationException("heapstate: the live state changed under a reader on another " +
      "thread than its writer's (two tasks on one state store at once?)")

  /**
   * A slot's hash tag: the hash's highest 21 bits, which a slot keeps above its address. The
   * highest, because they name the key's snapshot bucket (`BucketSet.containsTop21`, for
   * [[EntryTable.foreach]] given a set of buckets).
   */
  private def tagOf(hash: Int): Long = (hash >>> (32 - TagBits)).toLong
  private def pageIndex(s: Long): Int = (((s & AddressMask) >>> OffsetBits) - 1).toInt
  private def addressOf(page: Int, offset: Int): Long = ((page + 1).toLong << OffsetBits) | offset

  /** The most holes [[EntryTable.fillHoles]] is kept waiting for (28 bytes of bookkeeping each). */
  private val MaxHoles = 1 << 16

  /** How many entries ahead [[EntryTable.evacuate]] touches a slot (Java has no prefetch instruction). */
  private val ReadAhead = 8

  /** A power of two with room for `keys` at a load of at most one half. */
  def capacityFor(keys: Int): Int = {
    val want = math.max(16L, keys.toLong * 2)
    if (want >= (1 << 30)) 1 << 30 else Integer.highestOneBit((want - 1).toInt) << 1
  }
}

/**
 * One key and its value: `[key length: i32][value length: i32][key bytes][value bytes]`, where the
 * key and value bytes are `UnsafeRow`s. An entry is either a whole array of its own (a change, an
 * undo record, an entry read from a file: offset 0) or a stretch of an [[EntryTable]] page; either
 * way it is never changed once written. Offsets are indices into the array (add
 * `Platform.BYTE_ARRAY_OFFSET` for `Platform`'s calls).
 */
object Entry {
  private val Base = Platform.BYTE_ARRAY_OFFSET
  val HeaderBytes = 8

  def apply(key: Array[Byte], value: Array[Byte]): Array[Byte] =
    copyOf(key, value, Platform.BYTE_ARRAY_OFFSET, value.length)

  /** An entry of `key` and the `valueLength` bytes at `valueBase`/`valueOffset` (an `UnsafeRow`'s). */
  def copyOf(key: Array[Byte], valueBase: AnyRef, valueOffset: Long, valueLength: Int): Array[Byte] = {
    val e = new Array[Byte](HeaderBytes + key.length + valueLength)
    Platform.putInt(e, Base, key.length)
    Platform.putInt(e, Base + 4, valueLength)
    System.arraycopy(key, 0, e, HeaderBytes, key.length)
    Platform.copyMemory(valueBase, valueOffset, e, Base + HeaderBytes + key.length, valueLength)
    e
  }

  def keyLength(b: Array[Byte], at: Int): Int = Platform.getInt(b, Base + at)
  def valueLength(b: Array[Byte], at: Int): Int = Platform.getInt(b, Base + at + 4)
  /** The whole entry's length, header included. */
  def length(b: Array[Byte], at: Int): Int = HeaderBytes + keyLength(b, at) + valueLength(b, at)
  /** Whether the entries at `a(aAt)` and `b(bAt)` have the same key and value lengths: one can be written over the other. */
  def sameLengths(a: Array[Byte], aAt: Int, b: Array[Byte], bAt: Int): Boolean =
    keyLength(a, aAt) == keyLength(b, bAt) && valueLength(a, aAt) == valueLength(b, bAt)
  def keyStart(at: Int): Int = at + HeaderBytes
  def valueStart(b: Array[Byte], at: Int): Int = at + HeaderBytes + keyLength(b, at)

  def keyLength(e: Array[Byte]): Int = keyLength(e, 0)
  def valueLength(e: Array[Byte]): Int = valueLength(e, 0)

  def key(b: Array[Byte], at: Int): Array[Byte] = java.util.Arrays.copyOfRange(b, keyStart(at), valueStart(b, at))
  def value(b: Array[Byte], at: Int): Array[Byte] =
    java.util.Arrays.copyOfRange(b, valueStart(b, at), valueStart(b, at) + valueLength(b, at))
  def key(e: Array[Byte]): Array[Byte] = key(e, 0)
  def value(e: Array[Byte]): Array[Byte] = value(e, 0)

  def keyHash(b: Array[Byte], at: Int): Int = Key.hash(b, Base + at + HeaderBytes, keyLength(b, at))
  def keyHash(e: Array[Byte]): Int = keyHash(e, 0)

  /** Whether the key of the entry at `b`/`at` is the `length` bytes at `base`/`offset`. */
  def keyEquals(b: Array[Byte], at: Int, base: AnyRef, offset: Long, length: Int): Boolean =
    keyLength(b, at) == length && ByteArrayMethods.arrayEquals(b, Base + at + HeaderBytes, base, offset, length)

  /** Whether `e`'s key equals `key`. */
  def hasKey(e: Array[Byte], key: Key): Boolean = keyEquals(e, 0, key.bytes, Base, key.bytes.length)
}

/**
 * A look-up key that points at an entry array's key bytes, for hash maps keyed by [[Key]] (the
 * change set, the keys deleted above a loading snapshot). Like [[KeyProbe]], it is only ever the
 * argument of a look-up.
 */
final class EntryKeyProbe(val entry: Array[Byte], override val hashCode: Int) {
  def this(entry: Array[Byte]) = this(entry, Entry.keyHash(entry))
  override def equals(other: Any): Boolean = other match {
    case k: Key => k.hashCode == hashCode && Entry.hasKey(entry, k)
    case _ => false
  }
}
