package heapstate.engine

import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.array.ByteArrayMethods

/**
 * A state key: the bytes of a key row, owned by the store and never mutated, with its hash
 * computed once. Equality is byte equality, as for `UnsafeRow`.
 */
final class Key(val bytes: Array[Byte], override val hashCode: Int) {
  override def equals(other: Any): Boolean = other match {
    case k: Key => (k eq this) || (k.hashCode == hashCode && java.util.Arrays.equals(k.bytes, bytes))
    case _ => false
  }
  override def toString: String = s"Key(${bytes.length} bytes, hash $hashCode)"
}

object Key {
  // [[sameBytes]] and the live table's look-up read keys eight bytes at a time wherever they start.
  require(
    Platform.unaligned(),
    "heapstate needs a platform that allows unaligned memory reads (x86-64, aarch64, ppc64le, s390x)")

  /** The hash the live table and snapshot buckets share (a file-format fact: see `StateFileFormat`). */
  def hash(base: AnyRef, offset: Long, length: Int): Int = heapstate.io.StateFileFormat.keyHash(base, offset, length)

  def apply(bytes: Array[Byte]): Key = new Key(bytes, hash(bytes, Platform.BYTE_ARRAY_OFFSET, bytes.length))

  /** Copies `length` bytes at `base`/`offset` (for example an `UnsafeRow`'s) into a new key. */
  def copyOf(base: AnyRef, offset: Long, length: Int): Key =
    copyOf(base, offset, length, hash(base, offset, length))

  /**
   * Whether the `length` bytes at `a`/`aOffset` equal those at `b`/`bOffset`: eight bytes a step,
   * then one. It is what `ByteArrayMethods.arrayEquals` does where unaligned reads are allowed
   * (this object requires them), written small enough for the JIT to inline into a put's probe
   * (Spark's, once compiled on its own, is too large to be, and the probe then calls it for each
   * key it compares).
   */
  def sameBytes(a: AnyRef, aOffset: Long, b: AnyRef, bOffset: Long, length: Int): Boolean = {
    var i = 0
    while (i + 8 <= length) {
      if (Platform.getLong(a, aOffset + i) != Platform.getLong(b, bOffset + i)) return false
      i += 8
    }
    while (i < length) {
      if (Platform.getByte(a, aOffset + i) != Platform.getByte(b, bOffset + i)) return false
      i += 1
    }
    true
  }

  /** [[copyOf]] for a caller that already has the bytes' hash. */
  def copyOf(base: AnyRef, offset: Long, length: Int, hash: Int): Key = {
    val bytes = new Array[Byte](length)
    Platform.copyMemory(base, offset, bytes, Platform.BYTE_ARRAY_OFFSET, length)
    new Key(bytes, hash)
  }
}

/**
 * A look-up key that points into memory it does not own (a caller's `UnsafeRow`), so that reads
 * allocate nothing. Java's hash maps call `probe.equals(storedKey)`, which is the only direction
 * this supports; a probe is never stored.
 */
final class KeyProbe(val base: AnyRef, val offset: Long, val length: Int, override val hashCode: Int) {
  def this(base: AnyRef, offset: Long, length: Int) = this(base, offset, length, Key.hash(base, offset, length))
  override def equals(other: Any): Boolean = other match {
    case k: Key =>
      k.hashCode == hashCode && k.bytes.length == length &&
      ByteArrayMethods.arrayEquals(base, offset, k.bytes, Platform.BYTE_ARRAY_OFFSET, length)
    case _ => false
  }
}

/** The value that marks a key as absent: in a change set, a delete; in an undo entry, "absent". */
object Tombstone {
  val bytes: Array[Byte] = new Array[Byte](0)
  def is(value: Array[Byte]): Boolean = value eq bytes
}
