package heapstate.engine

/**
 * Estimates of the heap that heapstate's structures hold, for `memoryUsedBytes`. They follow the
 * layouts of a 64-bit HotSpot JVM with compressed oops (12-byte object headers, 8-byte alignment)
 * and are kept as running counts as entries come and go, so reporting costs nothing.
 */
object MemoryModel {
  private def array(length: Int): Long = align(16L + length)
  private def align(n: Long): Long = (n + 7) & ~7L

  /**
   * One [[Entry]] array of its own (an undo record's, a change's). The live table's entries are in
   * its pages, which [[EntryTable.heapBytes]] counts.
   */
  def liveEntry(entry: Array[Byte]): Long = array(entry.length)

  /**
   * A change: HashMap node and table share, the [[Key]] and its bytes, and the new [[Entry]]
   * (which the live table takes over at the commit), or nothing for a [[Tombstone]].
   */
  def changeEntry(key: Key, entry: Array[Byte]): Long =
    40 + array(key.bytes.length) + 24 + (if (Tombstone.is(entry)) 0 else array(entry.length))

  /**
   * An [[UndoEntry]] of `capacity` slots, without the prior entries it keeps alive (each counted
   * as [[liveEntry]]): the object (a header and five fields), its reference and hash arrays, and
   * its bit set (an object and its words).
   */
  def undoTable(capacity: Int): Long = 32 + 2 * array(4 * capacity) + 24 + array(8 * ((capacity + 63) / 64))

  /** A [[TouchedBuckets]] of `words` longs: the object (a header, an int, a boolean, a reference) and its array. */
  def touchedBuckets(words: Int): Long = 24 + array(8 * words)

  /** A prefix index member: a HashSet node plus its share of the set's table. */
  val prefixMember: Long = 48
}
