package heapstate.engine

import java.util.{HashMap => JHashMap, HashSet => JHashSet}
import java.util.concurrent.ConcurrentSkipListMap

import org.apache.spark.sql.catalyst.expressions.UnsafeRow

import heapstate.io.{SnapshotBuckets, StateFileException}

/**
 * The one live copy of a partition's state, the undo log that lets it step back, and the view
 * that lets a snapshot of an older committed version be written while the live state moves on.
 *
 * == Versions ==
 * `table` holds the state as of committed version `version`, one [[Entry]] (key and value rows
 * together) per key, packed into the table's pages. Committing version `w` (see [[applyCommit]])
 * first publishes an undo entry `undo(w)` (an [[UndoEntry]]): for every key `w` changes, the key's
 * entry as of `w - 1`, or "absent". Only then does it change `table`. Replaying `undo(w)` steps the table back
 * from `w` to `w - 1` ([[rollBackTo]]). An undo entry holds copies of the prior entries: the
 * table's pages keep only the live ones. When `w - 1` was empty (a query's first batch, a bulk
 * load), `undo(w)` is the marker [[UndoEntry.FromEmpty]] instead of one record per key: stepping
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
 *  1. For each key in the undo entries above `s`, in version order, the first entry's record is
 *     the value at `s`; emit it unless it says "absent".
 * A key that changes after step 1 passed it is emitted by both steps, with the same value (its
 * value at `s`). Readers therefore take a snapshot record as "the key has this value", and a
 * repeated key carries no new information. `docs/FORMAT.md` states this.
 *
 * == Loading lazily ==
 * A state rebuilt from a bucketed snapshot ([[beginLazy]]) starts with none of the snapshot's
 * keys in `table`: the snapshot is held as stored, and its buckets are decompressed into `table`
 * by [[loadSome]] (a share after each commit) and [[loadAll]]. Before that, a look-up of a key
 * the table does not know decompresses the key's bucket and copies out that one key's entry (a
 * look-up of another key in the same bucket loads the whole bucket). So a restart's first batch pays for
 * the keys it asks for, not for the whole state. The invariants that keep this exact:
 *  - the journals above the snapshot are applied first, into `table` (their entries are newer than
 *    the snapshot's) and, for their deletes, into `deleted`;
 *  - a key is known once it has been looked up: found in its bucket, its entry goes into `table`;
 *    absent, the key goes into `deleted` (a record "the snapshot has nothing for this key").
 *    Every commit looks up each key it changes first, so no change is ever made to a key that is
 *    not known;
 *  - while a key's bucket is not loaded, removing the key from `table` (a commit's or a journal's
 *    delete, a roll-back to before its insertion) also puts it in `deleted`;
 *  - a bucket loads only the keys found in neither `table` nor `deleted`, so it never overwrites a
 *    newer value or brings back a deleted key;
 *  - while buckets are pending, [[numKeys]] is the snapshot's key count plus every journal's and
 *    every commit's key delta; when the last bucket is in, it must equal `table`'s size;
 *  - iteration, prefix scans and snapshot views need every key: they load every bucket first
 *    (the view requires it: the engine writes no snapshot of a state still loading).
 * Loading happens on the thread that owns the state (the task thread, under the engine's lock
 * for commits), like every other change to `table`.
 *
 * == Memory ==
 * Undo entries are kept for the newest `undoVersions` commits, and for every version above a
 * snapshot being written. Older ones are dropped; an older version is then rebuilt from files.
 * A snapshot still loading holds its stored (compressed) bytes, on the heap or mapped from the
 * local file, until its last bucket is in.
 */
final class LiveState(val prefixOf: Option[Array[Byte] => Key], initialVersion: Long, expectedKeys: Int = 16) {
  private[engine] val table = new EntryTable(expectedKeys)
  private val undo = new ConcurrentSkipListMap[java.lang.Long, UndoEntry]()
  /**
   * What each undo entry counts in `undoBytes`, so that dropping one needs no walk over its
   * records (each a read of an old entry, long out of the cache). The writer's alone.
   */
  private val undoEntryBytes = new JHashMap[java.lang.Long, java.lang.Long]()
  private val byPrefix: Option[JHashMap[Key, JHashSet[Key]]] =
    prefixOf.map(_ => new JHashMap[Key, JHashSet[Key]]())

  @volatile var version: Long = initialVersion
  /** Heap of the prefix index; the entries' is the table's own count. */
  @volatile private var prefixBytes = 0L
  @volatile private var undoBytes = 0L
  /**
   * At least the newest version in `undo`, written right after each undo entry is published: a
   * snapshot view of `s` reads it instead of asking the undo log whether anything lies above `s`
   * (a skip-list search) for every entry. Roll-backs, which remove entries, may leave it too high,
   * which costs only that search.
   */
  @volatile private var undoTop = 0L
  /**
   * How many undo entries [[applyCommit]] has published, in all; it only grows, and each commit
   * writes it right after `undoTop`. A snapshot view copies the undo entries above its version
   * again when this has moved. `undoTop` could not serve for that: a roll-back leaves it as it
   * was, so the commits that re-do the versions rolled back write values it has had before.
   */
  @volatile private var undoPublished = 0L

  /** The snapshot whose buckets are not all in `table` yet (see "Loading lazily"), or null. */
  @volatile private[this] var pending: LiveState.PendingSnapshot = null
  /** The number of keys while `pending` is set (the table does not know the unloaded buckets'). */
  private var pendingKeys = 0L

  def numKeys: Long = if (pending != null) pendingKeys else table.size
  /** The bytes a snapshot's records of the loaded keys take before compression (a type byte and an entry each). */
  def recordBytes: Long = table.entryBytes + table.size
  def memoryBytes: Long = {
    val p = pending
    table.heapBytes + prefixBytes + undoBytes + (if (p == null) 0 else p.heldBytes)
  }
  /**
   * [[memoryBytes]] counted afresh from the table, the prefix index and the undo log, where
   * [[memoryBytes]] keeps running counts; tests hold the one to the other. It also checks the
   * table's own counts against its slots ([[EntryTable.checkAccounts]]) and throws if they differ.
   * The writer's thread only.
   */
  private[heapstate] def memoryBytesRecounted: Long = {
    table.checkAccounts() // each page's live bytes and the live total, against the slots
    var counted = table.heapBytesRecounted
    byPrefix.foreach(_.values().forEach(set => counted += MemoryModel.prefixMember * set.size))
    undo.values().forEach(u => if (u ne UndoEntry.FromEmpty) counted += u.recountBytes)
    val p = pending
    counted + (if (p == null) 0 else p.heldBytes)
  }
  /** The snapshot still loading, or null when none is. */
  def loadingSnapshot: SnapshotBuckets = { val p = pending; if (p == null) null else p.buckets }
  /** Whether every key is in `table` (no snapshot bucket is still to load). */
  def isFullyLoaded: Boolean = pending == null
  /** How many buckets of a snapshot are still to load. */
  def bucketsPending: Long = { val p = pending; if (p == null) 0 else p.remaining }
  def contains(key: Key): Boolean = get(key) != EntryTable.NoEntry
  /**
   * The address in `table` of the entry of the key `length` bytes at `base`/`offset` (hashing to
   * `hash`), or [[EntryTable.NoEntry]]; [[pageOf]] and [[offsetOf]] locate its bytes.
   */
  def get(base: AnyRef, offset: Long, length: Int, hash: Int): Long = {
    val p = pending
    if (p == null) table.find(base, offset, length, hash) else getPending(p, base, offset, length, hash)
  }
  /** [[get]], pointing `row` at the value found (see [[EntryTable.pointToValue]]); false when the key has none. */
  def pointToValue(base: AnyRef, offset: Long, length: Int, hash: Int, row: UnsafeRow): Boolean = {
    val p = pending
    if (p == null) table.pointToValue(base, offset, length, hash, row)
    else if (getPending(p, base, offset, length, hash) == EntryTable.NoEntry) false
    else table.pointToValue(base, offset, length, hash, row) // getPending put the key's entry in the table
  }
  def get(key: Key): Long =
    get(key.bytes, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET, key.bytes.length, key.hashCode)

  /** Bytes of the table's pages that no live entry uses (see [[EntryTable.garbageBytes]]). */
  def garbageBytes: Long = table.garbageBytes

  /** The page holding the entry at `address` (from [[get]], with no change to the state since). */
  def pageOf(address: Long): Array[Byte] = table.pageOf(address)
  /** The entry's first byte in [[pageOf]]. */
  def offsetOf(address: Long): Int = table.offsetOf(address)

  /**
   * [[get]] while snapshot `p` is loading (see "Loading lazily"): the table, when it has the key;
   * else nothing, when the key's bucket is in or the key is in `deleted`; else the first look-up
   * in a bucket decompresses it and copies out this key's entry alone, and a second one (of
   * another key) loads the whole bucket (a bucket asked for again is likely asked for more).
   */
  private def getPending(p: LiveState.PendingSnapshot, base: AnyRef, offset: Long, length: Int, hash: Int): Long =
    synchronized {
      if (p.failure != null) throw p.failure
      val inTable = table.find(base, offset, length, hash)
      val b = p.buckets.bucketOf(hash)
      if (inTable != EntryTable.NoEntry || (pending ne p) || p.loaded.get(b)) inTable
      else if (!p.deleted.isEmpty && p.deleted.contains(new KeyProbe(base, offset, length, hash))) EntryTable.NoEntry
      else if (p.probed.get(b)) { load(p, b); table.find(base, offset, length, hash) }
      else {
        p.probed.set(b)
        val entry = p.buckets.find(b, base, offset, length)
        // Found, it goes into the table, which the bucket's load will not overwrite; not found,
        // the key goes into `deleted`, so that asking again (as a commit does) decompresses nothing.
        if (entry != null) { store(entry, hash); table.find(base, offset, length, hash) }
        else { p.deleted.add(Key.copyOf(base, offset, length, hash)); EntryTable.NoEntry }
      }
    }

  /**
   * Every entry's address, once every pending bucket is loaded, for the owning thread between its
   * changes (see [[EntryTable.iterator]]).
   */
  def iterator: Iterator[Long] = { loadAll(); table.iterator }

  /** Loads an entry read from a file (single-threaded, before publication): a snapshot's, or a journal's put. */
  def loadEntry(entry: Array[Byte]): Unit = {
    val p = pending
    if (p != null && !p.deleted.isEmpty) p.deleted.remove(new EntryKeyProbe(entry))
    store(entry, Entry.keyHash(entry))
  }

  /** Loads a journal's delete record (single-threaded, before publication). */
  def loadDelete(key: Array[Byte]): Unit =
    remove(key, Key.hash(key, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET, key.length))

  /**
   * Starts this (empty, unpublished) state from `snapshot`, whose buckets load when their keys
   * are asked for. The journals above it follow through [[loadEntry]], [[loadDelete]] and
   * [[journalLoaded]].
   */
  def beginLazy(snapshot: SnapshotBuckets): Unit = {
    require(table.size == 0 && pending == null, "a snapshot is loaded into an empty state")
    pending = new LiveState.PendingSnapshot(snapshot)
    pendingKeys = snapshot.keyCount
    table.youngPagesOnly = true // see EntryTable.youngPagesOnly
    if (snapshot.keyCount == 0) loadAll()
  }

  /**
   * Counts a journal loaded on top of a pending snapshot: its key delta, or, for a journal that
   * does not record one (format 1), every bucket is loaded now, since the key count cannot be
   * known otherwise.
   */
  def journalLoaded(keyDelta: Option[Long]): Unit = if (pending != null) keyDelta match {
    case Some(d) => pendingKeys += d
    case None => pending.countUnknown = true; loadAll()
  }

  /** Loads the next `n` buckets not loaded yet. */
  def loadSome(n: Int): Unit = synchronized {
    val p = pending
    var left = n
    while (p != null && left > 0 && (pending eq p)) {
      while (p.loaded.get(p.next)) p.next += 1
      load(p, p.next)
      left -= 1
    }
  }

  /** Loads every bucket still pending. */
  def loadAll(): Unit = { val p = pending; if (p != null) loadSome(p.buckets.buckets) }

  /** How many buckets a commit loads: a lazily loaded state is whole after [[LiveState.LoadSteps]] commits. */
  def bucketsPerCommit: Int = {
    val p = pending; if (p == null) 0 else (p.buckets.buckets + LiveState.LoadSteps - 1) / LiveState.LoadSteps
  }

  /** Loads bucket `b` of `p` into `table`, skipping keys that journals or commits changed since. */
  private def load(p: LiveState.PendingSnapshot, b: Int): Unit = synchronized {
    if (p.failure != null) throw p.failure
    if ((pending eq p) && !p.loaded.get(b)) {
      val checkDeleted = !p.deleted.isEmpty
      // Straight from the decompressed bucket into the table's pages: no array per key.
      p.buckets.readRecords(b) { (raw, keyAt, keyLength, valueAt, valueLength, hash) =>
        val keyOffset = org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + keyAt
        val newer = table.find(raw, keyOffset, keyLength, hash) != EntryTable.NoEntry
        if (!newer && !(checkDeleted && p.deleted.contains(new KeyProbe(raw, keyOffset, keyLength, hash)))) {
          val previous = table.put(raw, keyAt, keyLength, valueAt, valueLength, hash)
          if (previous < 0) indexPrefix(java.util.Arrays.copyOfRange(raw, keyAt, keyAt + keyLength), hash)
        }
      }
      p.loaded.set(b)
      p.remaining -= 1
      if (p.remaining == 0) {
        if (!p.countUnknown && table.size != pendingKeys) {
          p.failure = new StateFileException(p.buckets.path, p.buckets.version,
            s"it and the journals above it " +
              s"hold ${table.size} keys once loaded, but their key counts say $pendingKeys")
          throw p.failure
        }
        pending = null
        table.youngPagesOnly = false
        p.buckets.close()
      }
    }
  }

  /**
   * The changes of `changes` as [[prepareCommit]] takes them, in arrays: no look-up in the table,
   * so the journal can be written from them before the look-ups (see StateEngine's commit).
   */
  def collect(changes: ChangeSet): CollectedChanges = {
    val fromEmpty = pending == null && table.size == 0
    // On an empty state, puts the change set moved to pages stay there, and are copied from them
    // (see "Large first batches" in ChangeSet); anywhere else every change is looked up by key.
    val paged = if (fromEmpty) changes.pagedPuts else null
    val n = if (paged == null) changes.size else changes.size - paged.size
    val keys = new Array[Key](n)
    val values = new Array[Array[Byte]](n)
    var i = 0
    val collect = (key: Key, changed: Array[Byte]) => { keys(i) = key; values(i) = changed; i += 1 }
    if (paged == null) changes.foreach(collect) else changes.foreachInMap(collect)
    new CollectedChanges(version, fromEmpty, keys, values, paged)
  }

  /** [[prepareCommit]] of [[collect]]ed `changes`. */
  def prepareCommit(changes: ChangeSet): PreparedCommit = prepareCommit(collect(changes))

  /**
   * What committing the `collected` changes as version `version + 1` will record: the undo entry
   * (every changed key's entry as of `version`, or [[Tombstone]]) and the change in the number of
   * keys. Looks every changed key up (see "Loading lazily": a key looked up is known); changes
   * nothing that a reader could see.
   */
  def prepareCommit(collected: CollectedChanges): PreparedCommit = {
    require(collected.version == version, s"changes collected at version ${collected.version} prepared at $version")
    if (collected.fromEmpty) {
      val values = collected.values
      val paged = collected.paged
      val added = values.count(v => !Tombstone.is(v)).toLong + (if (paged == null) 0 else paged.size)
      new PreparedCommit(version + 1, collected.keys, values, null, null, 0, UndoEntry.FromEmpty, 0L, added, paged)
    } else lookUpChanges(collected)
  }

  /**
   * [[prepareCommit]] of changes to a state that is not empty: looks every changed key up.
   *
   * A method of its own, apart from the commit onto an empty state, for the JIT: a commit runs
   * this loop once, so the JIT compiles it from the loop's own count, over several commits. In
   * one method with the empty state's branch, a JVM whose profile had not seen that branch
   * (a query's first batch onto an empty state, after the JVM had warmed up on others) threw the
   * compiled loop away when it came, and the commits after it ran the loop in the JIT's first,
   * slower tier until it had been counted again (W5: four to five batches; stop 75).
   */
  private def lookUpChanges(collected: CollectedChanges): PreparedCommit = {
    val keys = collected.keys
    val values = collected.values
    val n = keys.length
    // A whole table does not change while it is looked up, so the slot each key was found in
    // still holds it when the commit applies (unless a resize moves it; see applyCommit). A
    // table still loading may load buckets on a look-up: no slots are kept then.
    val whole = pending == null
    val slots = if (whole) new Array[Int](n) else null
    val priors = new Array[Long](n)
    val stamp = table.stamp
    val entry = UndoEntry.forKeys(n)
    var entryBytes = entry.tableBytes
    var delta = 0L
    var i = 0
    while (i < n) {
      if (whole && i % EntryTable.ReadAheadKeys == 0)
        table.readAhead(keys, i, math.min(i + EntryTable.ReadAheadKeys, n))
      val key = keys(i)
      val prior = if (whole) {
        val slot = table.slotOf(key)
        slots(i) = slot
        if (slot >= 0) table.addressAt(slot) else EntryTable.NoEntry
      } else get(key)
      priors(i) = prior
      // The undo entry keeps a copy: the table drops a page once none of its entries is live.
      val copy = if (prior == EntryTable.NoEntry) null else table.copyOf(prior)
      entry.record(copy, values(i), key.hashCode)
      if (copy != null) entryBytes += MemoryModel.liveEntry(copy)
      delta += ChangeSet.keyDelta(copy != null, values(i))
      i += 1
    }
    new PreparedCommit(version + 1, keys, values, slots, priors, stamp, entry, entryBytes, delta)
  }

  /**
   * Tests: run by [[applyCommit]] once the table holds the commit's changes, before the version
   * moves; one that throws stands for a commit failing half way (out of memory, say).
   */
  private[heapstate] var failAfterChanges: () => Unit = null

  /**
   * Commits what [[prepareCommit]] prepared: publish the undo entry, then change the map.
   * `keepUndoAbove`: undo entries at or below this version may be dropped afterwards.
   *
   * A key that was found in the table is updated in the slot [[prepareCommit]] found it in, with
   * no second probe (at millions of keys each probe is a cache miss or two); when a resize in
   * between moved it, [[EntryTable.replaceAt]] says so and the key takes the usual path.
   *
   * `inPlace`: no snapshot view or snapshot writer reads this state's table now, nor can one start
   * before this returns (the engine knows). An update of the same length is then written over the
   * old entry ([[EntryTable.overwriteAt]]) instead of appended; the undo entry holds the old bytes.
   * The updates of that length appended by earlier commits, made while a snapshot was written, go
   * back over their old entries too ([[EntryTable.fillHoles]]).
   */
  def applyCommit(prepared: PreparedCommit, keepUndoAbove: Long, inPlace: Boolean): Unit = {
    val newVersion = version + 1
    require(prepared.version == newVersion, s"a commit prepared as version ${prepared.version} applied at $newVersion")
    undo.put(newVersion, prepared.undoEntry) // published before any change to `table`
    undoEntryBytes.put(newVersion, prepared.undoBytes)
    undoTop = newVersion
    undoPublished += 1 // one writer: commits do not overlap
    // A volatile write keeps the writes before it in place, not the ones after: the fence keeps
    // the table's changes below from becoming visible before `undoTop` and `undoPublished` (see
    // writeSnapshotView).
    java.lang.invoke.VarHandle.storeStoreFence()
    undoBytes += prepared.undoBytes
    val keys = prepared.keys
    val values = prepared.values
    val slots = prepared.slots
    // Without slots kept (a first commit, or a state still loading) no look-up is lost to a resize.
    if (slots == null && prepared.keyDelta > 0) table.reserve(prepared.keyDelta)
    if (prepared.paged != null) { // an empty state: the change set's paged puts, from their pages
      require(byPrefix.isEmpty, "a change set with a prefix index moved puts to pages")
      prepared.paged.foreach { (page, at) =>
        table.put(page, Entry.keyStart(at), Entry.keyLength(page, at), Entry.valueStart(page, at),
          Entry.valueLength(page, at), Entry.keyHash(page, at))
      }
    }
    // The table copies the change set's entries into its pages, in one of three loops: each is
    // compiled for its own case, so the first commit made while a snapshot is written (never seen
    // in a warm-up whose snapshots are short) does not fail the assumptions of the in-place loop
    // and send it back to the interpreter (W5 at 4M keys: a deoptimisation and a C2 recompile of
    // this method in a measured batch). The two that reach the slots prepareCommit found walk the
    // keys from the last: the pages it looked up last are the ones still in the TLB (at 2,500
    // keys, two pages each, more than it holds), and would be the first pushed out going forward.
    if (slots == null) applyByKey(keys, values)
    else if (inPlace) writtenInPlace += applyInPlace(prepared)
    else applyAppending(prepared)
    if (pending != null) pendingKeys += prepared.keyDelta
    if (failAfterChanges != null) failAfterChanges()
    version = newVersion
    dropUndoUpTo(keepUndoAbove)
    // Updates appended while a snapshot was written go back where their old entries were.
    if (inPlace) movedBackBytes += table.fillHoles()
    // A state still loading its snapshot does not compact: its first batches after a restart stay
    // light, and the garbage journals left is moved at the usual pace once the load is done.
    if (pending == null) compactedBytes += table.compact() else table.skipCompaction()
  }

  /** [[applyCommit]]'s changes when no slots were kept: each key's usual path. */
  private def applyByKey(keys: Array[Key], values: Array[Array[Byte]]): Unit = {
    var i = 0
    while (i < keys.length) {
      val key = keys(i)
      val changed = values(i)
      if (Tombstone.is(changed)) remove(key.bytes, key.hashCode) else store(changed, key.hashCode)
      i += 1
    }
  }

  /**
   * [[applyCommit]]'s changes with no reader of the table: in the slot found, over the old entry
   * when the lengths match. Returns how many were written in place.
   */
  private def applyInPlace(prepared: PreparedCommit): Long = {
    val keys = prepared.keys
    val values = prepared.values
    val slots = prepared.slots
    val priors = prepared.priors
    val stamp = prepared.stamp
    var written = 0L
    var i = keys.length - 1
    while (i >= 0) {
      val key = keys(i)
      val changed = values(i)
      val slot = slots(i)
      if (Tombstone.is(changed)) remove(key.bytes, key.hashCode)
      else if (slot >= 0 && table.overwriteAt(slot, stamp, priors(i), changed)) written += 1
      else if (!(slot >= 0 && table.replaceAt(slot, stamp, priors(i), changed))) store(changed, key.hashCode)
      i -= 1
    }
    written
  }

  /** [[applyCommit]]'s changes while a reader holds the table's bytes: appended, in the slot found. */
  private def applyAppending(prepared: PreparedCommit): Unit = {
    val keys = prepared.keys
    val values = prepared.values
    val slots = prepared.slots
    val priors = prepared.priors
    val stamp = prepared.stamp
    var i = keys.length - 1
    while (i >= 0) {
      val key = keys(i)
      val changed = values(i)
      val slot = slots(i)
      if (Tombstone.is(changed)) remove(key.bytes, key.hashCode)
      else if (!(slot >= 0 && table.replaceAt(slot, stamp, priors(i), changed))) store(changed, key.hashCode)
      i -= 1
    }
  }

  /** Bytes of entries the table's compaction has moved (see [[EntryTable.compact]]), in all. */
  @volatile var compactedBytes = 0L
  /** Updates commits wrote over the old entry (see `inPlace` in [[applyCommit]]), in all. */
  @volatile var writtenInPlace = 0L
  /** Bytes of appended updates moved back over their old entries ([[EntryTable.fillHoles]]), in all. */
  @volatile var movedBackBytes = 0L

  /** Whether undo entries cover every version in (target, version]. */
  def canRollBackTo(target: Long): Boolean =
    target <= version && (target + 1 to version).forall(v => undo.containsKey(v))

  /** Steps back to `target`; the caller has checked [[canRollBackTo]] and holds the snapshot lock. */
  def rollBackTo(target: Long): Unit = {
    while (version > target) {
      val entry = undo.remove(version)
      forgetUndoBytes(version)
      if (entry eq UndoEntry.FromEmpty) {
        table.clear(); byPrefix.foreach(_.clear()); prefixBytes = 0
      }
      val counting = pending != null // the commit looked up every key of `entry`: the table knows them
      entry.foreach { (recorded, hash, wasAbsent) =>
        if (counting) {
          pendingKeys += ChangeSet.keyDelta(table.findKeyOf(recorded, hash) != EntryTable.NoEntry,
            if (wasAbsent) Tombstone.bytes else recorded)
        }
        if (wasAbsent) remove(Entry.key(recorded), hash) else store(recorded, hash)
      }
      version -= 1
    }
  }

  def dropUndoUpTo(v: Long): Unit = {
    var first = undo.firstEntry()
    while (first != null && first.getKey <= v) {
      forgetUndoBytes(first.getKey)
      undo.remove(first.getKey)
      first = undo.firstEntry()
    }
  }

  /** Takes the undo entry of `v` out of `undoBytes`, as it leaves the undo log. */
  private def forgetUndoBytes(v: Long): Unit = {
    val bytes = undoEntryBytes.remove(v)
    if (bytes != null) undoBytes -= bytes
  }

  /** Stores a copy of `entry` (its key hashing to `hash`) in the table, and its key in the prefix index. */
  private def store(entry: Array[Byte], hash: Int): Unit = {
    val previous = table.put(entry, hash)
    if (previous < 0 && byPrefix.isDefined) indexPrefix(Entry.key(entry), hash)
  }

  /** Adds a new key (its bytes, hashing to `hash`) to the prefix index, if there is one. */
  private def indexPrefix(keyBytes: Array[Byte], hash: Int): Unit = byPrefix.foreach { index =>
    val key = new Key(keyBytes, hash)
    index.computeIfAbsent(prefixOf.get(key.bytes), _ => new JHashSet[Key]()).add(key)
    prefixBytes += MemoryModel.prefixMember
  }

  /**
   * Removes `key` (hashing to `hash`) from the table and the prefix index; while a snapshot is
   * loading, also from the snapshot's buckets not loaded yet (through `deleted`).
   */
  private def remove(key: Array[Byte], hash: Int): Unit = {
    val p = pending
    if (p != null && !p.loaded.get(p.buckets.bucketOf(hash))) p.deleted.add(new Key(key, hash))
    val previous = table.remove(key, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET, key.length, hash)
    if (previous >= 0) byPrefix.foreach { index =>
      val prefix = prefixOf.get(key)
      val set = index.get(prefix)
      if (set != null) { set.remove(new Key(key, hash)); if (set.isEmpty) index.remove(prefix) }
      prefixBytes -= MemoryModel.prefixMember
    }
  }

  /** The live keys that share `prefix` (task thread only; the table does not move during a batch). */
  def keysWithPrefix(prefix: Key): java.util.Set[Key] = { loadAll(); byPrefix } match {
    case Some(index) =>
      val set = index.get(prefix)
      if (set == null) java.util.Collections.emptySet[Key]() else set
    case None => throw new IllegalStateException("this store was not created for prefix scans")
  }

  /**
   * Emits the state as of committed version `s` (<= `version`), as described in the class
   * comment, while commits may go on. The caller holds the snapshot lock and keeps undo entries
   * above `s` alive until this returns. `emit` gets each entry (an array and the entry's offset in
   * it, a table page's or an undo record's) with its key's hash, which the view computes once for
   * its own look-ups and the snapshot's buckets. The bytes do not change until the caller's
   * snapshot ends, however long after this returns it reads them: commits write nothing in place
   * while a snapshot is being written (see `inPlace` in [[applyCommit]]).
   *
   * Given `only`, it emits the keys of the buckets in `only` alone, and reads no other key's bytes
   * (see [[EntryTable.foreach]]).
   */
  def writeSnapshotView(s: Long, emit: LiveState.ViewVisitor, only: BucketSet = null): Unit = {
    require(pending == null, "a snapshot view of a state whose snapshot is still loading")
    val later = undo.tailMap(s, false)
    // The undo entries above `s`, copied out of the map again only when `undoPublished` has moved
    // (once per commit made while the view runs). Walking the map for each of the table's entries
    // cost more than the look-ups in the entries: about 25 ms a view of a W1 store once any entry
    // was above `s`, against 23 ms for the whole view with none (bench/SnapshotView).
    var seenPublished = -1L
    var above = new Array[UndoEntry](0)
    // The entry was read before this; the fence keeps the reads of `undoPublished` and `undoTop`
    // after it, so that an entry a commit after `s` stored is always followed by seeing that
    // commit's values of both (or later ones), and so its undo entry, which the commit published
    // first, in `above`.
    def changedAfterS(page: Array[Byte], at: Int, hash: Int): Boolean = {
      java.lang.invoke.VarHandle.loadLoadFence()
      val published = undoPublished
      undoTop > s && {
        if (published != seenPublished) {
          above = later.values().toArray(new Array[UndoEntry](0)); seenPublished = published
        }
        var found = false
        var i = 0
        while (!found && i < above.length) {
          val u = above(i); found = (u eq UndoEntry.FromEmpty) || u.containsKeyOf(page, at, hash); i += 1
        }
        found
      }
    }
    // The entry is taken first, then the undo log is consulted (see the class comment).
    table.foreach({ (page, at) =>
        val hash = Entry.keyHash(page, at) // the slot keeps only part of it
        if (!changedAfterS(page, at, hash)) emit(page, at, hash)
      }, only)
    // A key's record in the first of these entries that has the key holds its value at `s`.
    val earlier = scala.collection.mutable.ArrayBuffer.empty[UndoEntry]
    def recordedEarlier(recorded: Array[Byte], hash: Int): Boolean = {
      var j = 0
      while (j < earlier.length) { if (earlier(j).containsKeyOf(recorded, hash)) return true; j += 1 }
      false
    }
    val it = later.values().iterator()
    var emptied = false // past a FromEmpty marker, every key first seen was absent at `s`
    while (it.hasNext && !emptied) {
      val u = it.next()
      if (u eq UndoEntry.FromEmpty) emptied = true
      else {
        u.foreach { (recorded, hash, wasAbsent) =>
          if (!wasAbsent && (only == null || only.containsHash(hash)) && !recordedEarlier(recorded, hash)) {
            emit(recorded, 0, hash)
          }
        }
        earlier += u
      }
    }
  }
}

object LiveState {
  /**
   * What [[LiveState.writeSnapshotView]] calls with each entry it emits: its array, its offset
   * there and its key's hash (primitive arguments: a Scala function of three would box both ints
   * for each of a state's entries).
   */
  trait ViewVisitor {
    def apply(b: Array[Byte], at: Int, hash: Int): Unit
  }

  /** A lazily loaded state is whole after at most this many commits, each loading its share. */
  val LoadSteps = 8

  /** A snapshot being loaded bucket by bucket, and the keys journals deleted above it. */
  private final class PendingSnapshot(val buckets: SnapshotBuckets) {
    val loaded = new java.util.BitSet(buckets.buckets)
    /** Buckets a look-up has decompressed once for one key (see [[LiveState.getPending]]). */
    val probed = new java.util.BitSet(buckets.buckets)
    var remaining: Int = buckets.buckets
    /** No bucket below this one is left to load. */
    var next = 0
    val deleted = new JHashSet[Key]()
    /** Set by a journal that records no key delta (format 1): the count is the table's once loaded. */
    var countUnknown = false
    /** Set when the loaded keys did not add up: the state must not be used. */
    var failure: StateFileException = null
    def heldBytes: Long = buckets.heldBytes + 64L * deleted.size
  }
}

/**
 * A change set's changes as of live version `version`, in arrays ([[LiveState.collect]]): the keys
 * and their new entries (or [[Tombstone]]s) in one order, and on an empty state (`fromEmpty`) the
 * puts the change set moved to pages, which are not in `keys` (else null).
 */
final class CollectedChanges private[engine] (
    private[engine] val version: Long,
    private[engine] val fromEmpty: Boolean,
    private[engine] val keys: Array[Key],
    private[engine] val values: Array[Array[Byte]],
    private[engine] val paged: EntryTable)

/** What a commit of version `version` records; see [[LiveState.prepareCommit]]. */
final class PreparedCommit private[engine] (
    val version: Long,
    /** The changed keys and their new entries (or [[Tombstone]]s), in one order. */
    private[engine] val keys: Array[Key],
    private[engine] val values: Array[Array[Byte]],
    /** For each key, the table slot it was found in, or -1; null when no slots were kept. */
    private[engine] val slots: Array[Int],
    /** For each key, the address of the entry the look-up found, or [[EntryTable.NoEntry]]. */
    private[engine] val priors: Array[Long],
    /** The table's [[EntryTable.stamp]] when the slots were found. */
    private[engine] val stamp: Int,
    private[engine] val undoEntry: UndoEntry,
    private[engine] val undoBytes: Long,
    /** Keys added minus keys removed. */
    val keyDelta: Long,
    /**
     * On an empty state, the change set's puts moved to pages, which are not in `keys`: the commit
     * and the journal read them there (see "Large first batches" in [[ChangeSet]]). Else null.
     */
    private[engine] val paged: EntryTable = null)
