package heapstate.engine

import heapstate.io.StateFileFormat

/**
 * Which snapshot buckets commits changed a key of since some snapshot (see "Reusing buckets" in
 * [[StateEngine]]): a bit for each of `1 << bits` buckets, set through the bucket of each changed
 * key's hash ([[StateFileFormat.bucketOf]]). It answers for any coarser split of the keys too:
 * bucket `b` of `1 << k` buckets (`k <= bits`) is buckets `b << (bits - k)` to
 * `((b + 1) << (bits - k)) - 1` of this one. At most 2^20 bits (128 KiB). Not thread-safe: the
 * engine uses it under its `reuseLock`, or alone (a copy).
 */
final class TouchedBuckets(val bits: Int) {
  require(bits >= 0 && bits <= StateFileFormat.MaxBucketBits, s"$bits bucket bits")
  private val words = new Array[Long](math.max(1, (1 << bits) >>> 6))
  private var all = false

  def mark(hash: Int): Unit = {
    val b = StateFileFormat.bucketOf(hash, bits)
    words(b >>> 6) |= 1L << (b & 63)
  }

  /** Counts every bucket as changed (a change whose keys are not looked at one by one). */
  def markAll(): Unit = all = true

  /** Whether no key of bucket `b` of `1 << k` was marked; false for a split finer than this one's. */
  def untouched(b: Int, k: Int): Boolean = !all && k <= bits && {
    val shift = bits - k
    var i = b << shift
    val until = (b + 1) << shift
    var clear = true
    while (clear && i < until) {
      if ((i & 63) == 0 && until - i >= 64) { clear = words(i >>> 6) == 0; i += 64 }
      else { clear = (words(i >>> 6) & (1L << (i & 63))) == 0; i += 1 }
    }
    clear
  }

  /** Whether [[markAll]] counted every bucket as changed. */
  def markedAll: Boolean = all

  /**
   * The buckets of `1 << k` that hold a marked key: every one past [[markAll]], or for a split
   * finer than this one's. What a snapshot view that reads only the changed buckets' keys looks
   * each key up in (see "Viewing the changed buckets only" in [[StateEngine]]).
   */
  def touchedAt(k: Int): BucketSet = {
    require(k >= 0 && k <= StateFileFormat.MaxBucketBits, s"$k bucket bits")
    val set = new Array[Long](math.max(1, (1 << k) >>> 6))
    var b = 0
    while (b < (1 << k)) {
      if (!untouched(b, k)) set(b >>> 6) |= 1L << (b & 63)
      b += 1
    }
    new BucketSet(k, set)
  }

  /** The heap this holds ([[MemoryModel]]). */
  def heapBytes: Long = MemoryModel.touchedBuckets(words.length)

  def copy(): TouchedBuckets = {
    val c = new TouchedBuckets(bits)
    System.arraycopy(words, 0, c.words, 0, words.length)
    c.all = all
    c
  }
}

object TouchedBuckets {
  /**
   * A split fine enough for the next snapshot of a state of `recordBytes` of records in buckets of
   * `bucketBytes`: one step finer than it needs today, so that it still serves if the state grows
   * up to twice as large.
   */
  def forState(recordBytes: Long, bucketBytes: Int): TouchedBuckets =
    new TouchedBuckets(math.min(StateFileFormat.MaxBucketBits,
        StateFileFormat.bucketBitsFor(recordBytes, bucketBytes) + 1))
}

/**
 * Some of the buckets of `1 << bits` ([[StateFileFormat.bucketOf]]), one bit each in `words`.
 * Immutable once made, so any thread may read it.
 */
final class BucketSet(val bits: Int, words: Array[Long]) {
  require(bits >= 0 && bits <= StateFileFormat.MaxBucketBits, s"$bits bucket bits")
  require(words.length == math.max(1, (1 << bits) >>> 6), s"${words.length} words for $bits bucket bits")

  def containsBucket(b: Int): Boolean = (words(b >>> 6) & (1L << (b & 63))) != 0
  def containsHash(hash: Int): Boolean = containsBucket(StateFileFormat.bucketOf(hash, bits))

  /**
   * Whether the bucket of a hash whose highest 21 bits are `top21` (`hash >>> 11`, what
   * [[EntryTable]]'s slots keep of a key's hash) is in the set: a bucket is named by a hash's
   * highest bits, at most 20 of them.
   */
  def containsTop21(top21: Int): Boolean = containsBucket(if (bits == 0) 0 else top21 >>> (21 - bits))

  /** How many buckets are in the set. */
  def size: Int = {
    var n = 0
    var i = 0
    while (i < words.length) { n += java.lang.Long.bitCount(words(i)); i += 1 }
    n
  }
}
