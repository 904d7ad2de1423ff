package heapstate.engine

import java.util.{HashMap => JHashMap, HashSet => JHashSet}

/**
 * The changes of one batch, on top of a live state that does not move while the batch runs.
 * Each changed key appears once, with its last value or a [[Tombstone]] (squashing): a key
 * written a hundred times costs one journal record. A key that the batch both created and
 * removed leaves no trace at all.
 *
 * A value is held as the key's whole [[Entry]], built once when the batch writes it: the journal
 * writes it as it is, and the commit copies it into the live table's pages.
 *
 * == Large first batches ==
 * In the hash map a change is four objects (its node, key, key bytes and entry). A batch that
 * fills an empty state (a new query's first batch, W1's batch 0 of a million keys) holds them all
 * until its commit, long enough for young collections to copy and promote them: in W1 that made
 * G1 grow the heap by 1 to 2 GB, into which the young generation then grew over the next 20
 * batches, each taking up to tens of thousands of first-touch page faults
 * (docs/PERFORMANCE_HISTORY.md, stop 46). So on a live state that was empty when the batch
 * began, once the map holds `pagesFrom` changes, its puts move into an [[EntryTable]] of their
 * own ([[paged]]): one slot array and pages that, past its first 16 MB or so, are a G1 region
 * each, which young collections never copy (see [[EntryTable.PageBytes]]). A key is in the map
 * or in `paged`, never both; the map keeps removals and the puts since the last move. Its
 * commit, on a state still empty, copies `paged`'s entries into the live table from their pages
 * ([[LiveState.applyCommit]]), and the journal writes them from there.
 */
final class ChangeSet(live: LiveState, pagesFrom: Int = ChangeSet.PagesFrom) {
  require(pagesFrom >= 1, s"pagesFrom must be at least 1, not $pagesFrom")
  private var entries = new JHashMap[AnyRef, Array[Byte]]()
  private val byPrefix: Option[JHashMap[Key, JHashSet[Key]]] =
    live.prefixOf.map(_ => new JHashMap[Key, JHashSet[Key]]())
  /** Whether puts may move to [[paged]]: the live state was empty and has no prefix index. */
  private val mayPage = byPrefix.isEmpty && live.isFullyLoaded && live.numKeys == 0
  /** The puts moved out of [[entries]] (see "Large first batches"); null until the first move. */
  private var paged: EntryTable = null

  /** Every put and remove the batch made, squashed or not. */
  var operations = 0L
  /** Estimated heap bytes held by the changes in [[entries]]. */
  private var mapBytes = 0L

  /** Estimated heap bytes held by the changes. */
  def bytes: Long = mapBytes + (if (paged == null) 0L else paged.heapBytes)
  def size: Int = entries.size + (if (paged == null) 0 else paged.size)
  def isEmpty: Boolean = size == 0
  /** The puts moved to pages (see "Large first batches"), or null; the commit reads them there. */
  private[heapstate] def pagedPuts: EntryTable = paged
  /** The changes still in the map, as [[foreach]] gives them, without [[pagedPuts]]. */
  private[engine] def foreachInMap(f: (Key, Array[Byte]) => Unit): Unit = {
    val it = entries.entrySet().iterator()
    while (it.hasNext) { val e = it.next(); f(e.getKey.asInstanceOf[Key], e.getValue) }
  }

  /**
   * Keys added minus keys removed, against the live state: one look-up per changed key, so for
   * metrics asked for before the commit (Spark asks after it), not for every operation.
   */
  def keyDelta: Long = {
    var delta = 0L
    foreachInMap((key, value) => delta += ChangeSet.keyDelta(live.contains(key), value))
    // Puts move to pages only on a state that was empty: each is a new key.
    delta + (if (paged == null) 0 else paged.size)
  }

  /**
   * The batch's [[Entry]] for `probe` (a [[Key]] or a [[KeyProbe]]): `null` when unchanged,
   * [[Tombstone]] when removed. A put moved to pages comes back as a copy.
   */
  def lookup(probe: AnyRef): Array[Byte] = {
    val changed = entries.get(probe)
    if (changed != null || paged == null) changed
    else {
      val address = probe match {
        case k: Key => paged.find(k)
        case p: KeyProbe => paged.find(p.base, p.offset, p.length, p.hashCode)
        case other => throw new IllegalArgumentException(s"not a key: $other")
      }
      if (address == EntryTable.NoEntry) null else paged.copyOf(address)
    }
  }

  /** Moves the puts of the map to [[paged]] (see "Large first batches"); removals stay. */
  private def movePuts(): Unit = {
    if (paged == null) paged = new EntryTable(2 * entries.size)
    val kept = new JHashMap[AnyRef, Array[Byte]]()
    val it = entries.entrySet().iterator()
    while (it.hasNext) {
      val e = it.next()
      val key = e.getKey.asInstanceOf[Key]
      if (Tombstone.is(e.getValue)) kept.put(key, e.getValue) else paged.put(e.getValue, key.hashCode)
    }
    entries = kept
    mapBytes = 0L
    kept.forEach((k, v) => mapBytes += MemoryModel.changeEntry(k.asInstanceOf[Key], v))
  }

  /**
   * Records `entry`, the [[Entry]] of `key` and its new value, as the key's change.
   *
   * Does not look at the live state: whether the key is new only matters to [[keyDelta]], and
   * the commit looks each changed key up anyway. A look-up in a table of millions of keys is a
   * cache miss or two, the larger part of a put's cost.
   */
  def put(key: Key, entry: Array[Byte]): Unit = {
    operations += 1
    val previous = entries.put(key, entry)
    if (previous == null) {
      mapBytes += MemoryModel.changeEntry(key, entry)
      // A key whose put moved to pages changes again: it is the map's now.
      val wasPaged = paged != null && paged.remove(key) >= 0
      if (!wasPaged) indexPrefix(key)
      if (mayPage && entries.size >= pagesFrom) movePuts()
    } else {
      mapBytes += MemoryModel.changeEntry(key, entry) - MemoryModel.changeEntry(key, previous)
    }
  }

  def remove(key: Key): Unit = {
    operations += 1
    val inLive = live.contains(key)
    val previous = entries.get(key)
    // A put that moved to pages is dropped there; the key is then as if the batch never put it.
    if (previous == null && paged != null) paged.remove(key)
    if (previous == null) {
      if (inLive) {
        entries.put(key, Tombstone.bytes)
        mapBytes += MemoryModel.changeEntry(key, Tombstone.bytes)
        indexPrefix(key)
      }
    } else if (!Tombstone.is(previous)) {
      if (inLive) {
        entries.put(key, Tombstone.bytes)
        mapBytes += MemoryModel.changeEntry(key, Tombstone.bytes) - MemoryModel.changeEntry(key, previous)
      } else {
        entries.remove(key)
        mapBytes -= MemoryModel.changeEntry(key, previous)
        byPrefix.foreach { index =>
          val prefix = live.prefixOf.get(key.bytes)
          val set = index.get(prefix)
          if (set != null) { set.remove(key); if (set.isEmpty) index.remove(prefix) }
        }
      }
    }
  }

  private def indexPrefix(key: Key): Unit = byPrefix.foreach { index =>
    index.computeIfAbsent(live.prefixOf.get(key.bytes), _ => new JHashSet[Key]()).add(key)
  }

  /** A copy of the changes, safe to iterate while the batch keeps writing. */
  def copy(): JHashMap[AnyRef, Array[Byte]] = {
    val all = new JHashMap[AnyRef, Array[Byte]](entries)
    foreachPaged((key, entry) => all.put(key, entry))
    all
  }

  /** Calls `f` with each put moved to pages, as a new key and a copy of its entry. */
  private def foreachPaged(f: (Key, Array[Byte]) => Unit): Unit = if (paged != null) {
    val found = new java.util.ArrayList[Array[Byte]](paged.size)
    paged.foreach((page, at) => found.add(java.util.Arrays.copyOfRange(page, at, at + Entry.length(page, at))))
    found.forEach(entry => f(Key(Entry.key(entry)), entry))
  }

  /** The changed keys that share `prefix`, copied. */
  def keysWithPrefix(prefix: Key): Array[Key] = byPrefix match {
    case Some(index) =>
      val set = index.get(prefix)
      if (set == null) Array.empty else set.toArray(new Array[Key](set.size))
    case None => throw new IllegalStateException("this store was not created for prefix scans")
  }

  /** Calls `f` with every change: those in the map, then the puts moved to pages (as copies). */
  def foreach(f: (Key, Array[Byte]) => Unit): Unit = { foreachInMap(f); foreachPaged(f) }

  def clear(): Unit = { entries.clear(); paged = null; byPrefix.foreach(_.clear()); mapBytes = 0 }

  /** Drops the changes and the memory behind them, once they are committed; counters stay. */
  def release(): Unit = {
    entries = new JHashMap[AnyRef, Array[Byte]](); paged = null; byPrefix.foreach(_.clear())
  }
}

object ChangeSet {
  /**
   * The changes a batch on an empty state holds in its hash map before it moves the puts to pages
   * (see "Large first batches" in [[ChangeSet]]): far above W1's 2,500 a store and batch, where
   * the map is cheaper, and a few MB of objects.
   */
  val PagesFrom: Int = 16384

  /** How changing a key to `value` (an entry, or [[Tombstone]]) moves the key count, given whether the key is `present`. */
  def keyDelta(present: Boolean, value: Array[Byte]): Int =
    if (Tombstone.is(value)) { if (present) -1 else 0 }
    else if (present) 0
    else 1
}
