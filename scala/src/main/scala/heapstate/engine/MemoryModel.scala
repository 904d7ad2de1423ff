package heapstate.engine

/**
 * Estimates of the heap that heapstate's structures hold, for `memoryUsedBytes`. They follow the
 * layouts of a 64-bit HotSpot JVM with compressed oops (12-byte object headers, 8-byte alignment)
 * and are kept per entry as entries come and go, so reporting costs nothing.
 */
object MemoryModel {
  private def array(length: Int): Long = align(16L + length)
  private def align(n: Long): Long = (n + 7) & ~7L

  /** A ConcurrentHashMap node (32), its share of the table (8), the Key (24) and both arrays. */
  def liveEntry(key: Key, value: Array[Byte]): Long = 64 + array(key.bytes.length) + array(value.length)

  /** A HashMap node and table share; the key is shared with the live map. */
  def changeEntry(key: Key, value: Array[Byte]): Long =
    40 + array(key.bytes.length) + 24 + (if (Tombstone.is(value)) 0 else array(value.length))

  /** An undo record: HashMap node and table share; keys are shared, old values are kept alive. */
  def undoEntry(prior: Array[Byte]): Long = 40 + (if (Tombstone.is(prior)) 0 else array(prior.length))

  /** A prefix index member: a HashSet node plus its share of the set's table. */
  val prefixMember: Long = 48
}
