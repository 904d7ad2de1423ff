package heapstate.engine

import java.util.{HashMap => JHashMap, HashSet => JHashSet}

/**
 * The changes of one batch, on top of a live state that does not move while the batch runs.
 * Each changed key appears once, with its last value or a [[Tombstone]] (squashing): a key
 * written a hundred times costs one journal record. A key that the batch both created and
 * removed leaves no trace at all.
 *
 * A value is held as the key's whole [[Entry]], built once when the batch writes it: the journal
 * writes it as it is, and the commit stores that same immutable array in the live table.
 */
final class ChangeSet(live: LiveState) {
  private var entries = new JHashMap[AnyRef, Array[Byte]]()
  private val byPrefix: Option[JHashMap[Key, JHashSet[Key]]] =
    live.prefixOf.map(_ => new JHashMap[Key, JHashSet[Key]]())

  /** Every put and remove the batch made, squashed or not. */
  var operations = 0L
  /** Estimated heap bytes held by the changes. */
  var bytes = 0L

  def size: Int = entries.size
  def isEmpty: Boolean = entries.isEmpty

  /**
   * Keys added minus keys removed, against the live state: one look-up per changed key, so for
   * metrics asked for before the commit (Spark asks after it), not for every operation.
   */
  def keyDelta: Long = {
    var delta = 0L
    foreach((key, value) => delta += ChangeSet.keyDelta(live.contains(key), value))
    delta
  }

  /** The batch's [[Entry]] for `probe`: `null` when unchanged, [[Tombstone]] when removed. */
  def lookup(probe: AnyRef): Array[Byte] = entries.get(probe)

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
      bytes += MemoryModel.changeEntry(key, entry)
      indexPrefix(key)
    } else {
      bytes += MemoryModel.changeEntry(key, entry) - MemoryModel.changeEntry(key, previous)
    }
  }

  def remove(key: Key): Unit = {
    operations += 1
    val inLive = live.contains(key)
    val previous = entries.get(key)
    if (previous == null) {
      if (inLive) {
        entries.put(key, Tombstone.bytes)
        bytes += MemoryModel.changeEntry(key, Tombstone.bytes)
        indexPrefix(key)
      }
    } else if (!Tombstone.is(previous)) {
      if (inLive) {
        entries.put(key, Tombstone.bytes)
        bytes += MemoryModel.changeEntry(key, Tombstone.bytes) - MemoryModel.changeEntry(key, previous)
      } else {
        entries.remove(key)
        bytes -= MemoryModel.changeEntry(key, previous)
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
  def copy(): JHashMap[AnyRef, Array[Byte]] = new JHashMap[AnyRef, Array[Byte]](entries)

  /** The changed keys that share `prefix`, copied. */
  def keysWithPrefix(prefix: Key): Array[Key] = byPrefix match {
    case Some(index) =>
      val set = index.get(prefix)
      if (set == null) Array.empty else set.toArray(new Array[Key](set.size))
    case None => throw new IllegalStateException("this store was not created for prefix scans")
  }

  def foreach(f: (Key, Array[Byte]) => Unit): Unit = {
    val it = entries.entrySet().iterator()
    while (it.hasNext) { val e = it.next(); f(e.getKey.asInstanceOf[Key], e.getValue) }
  }

  def clear(): Unit = { entries.clear(); byPrefix.foreach(_.clear()); bytes = 0 }

  /** Drops the changes and the memory behind them, once they are committed; counters stay. */
  def release(): Unit = { entries = new JHashMap[AnyRef, Array[Byte]](); byPrefix.foreach(_.clear()) }
}

object ChangeSet {
  /** How changing a key to `value` (an entry, or [[Tombstone]]) moves the key count, given whether the key is `present`. */
  def keyDelta(present: Boolean, value: Array[Byte]): Int =
    if (Tombstone.is(value)) { if (present) -1 else 0 }
    else if (present) 0
    else 1
}
