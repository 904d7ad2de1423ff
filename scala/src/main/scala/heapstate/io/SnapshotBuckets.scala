package heapstate.io

import scala.util.control.NonFatal

import org.apache.hadoop.fs.Path

/**
 * A checked format-2 snapshot held in memory as stored (compressed: on the heap, or mapped from
 * the local file), read one bucket at a time: what lets a restart decompress only the buckets of
 * the keys a batch touches. The body, its checksum, trailer and index were checked when it was
 * opened; [[read]] checks each bucket's records as it decodes them. Use it from one thread at a
 * time; [[close]] frees the codec's native state (which is also freed if the instance is dropped
 * unclosed).
 */
final class SnapshotBuckets private[io] (
    val path: Path,
    val version: Long,
    header: StateFileFormat.Header,
    body: ChunkedBytes,
    /** The CRC-32C of the body, as checked against the trailer. */
    val bodyCrc: Int,
    bits: Int,
    index: Array[Int],
    offsets: Array[Long],
    val keyCount: Long,
    /** The zstd dictionary its buckets were compressed with (format 3), or null. */
    val dictionary: Array[Byte] = null) extends AutoCloseable {
  import StateFileFormat._

  private val blocks = new SnapshotBuckets.CodecHolder(header.codec.blocks(dictionary))
  private val cleanable = cleaner.register(this, blocks)

  def buckets: Int = 1 << bits
  def bucketBits: Int = bits
  def bucketOf(hash: Int): Int = StateFileFormat.bucketOf(hash, bits)
  /** The codec of the buckets' stored bytes. */
  def codec: Codec = header.codec
  /** Bucket `b`'s index entry: its stored (compressed) length, raw length and record count. */
  def storedLength(b: Int): Int = index(3 * b)
  def rawLength(b: Int): Int = index(3 * b + 1)
  def recordCount(b: Int): Int = index(3 * b + 2)

  /**
   * Writes bucket `b`'s stored bytes to `out` as they are, without decompressing them (see
   * [[BucketReuse]]), through `scratch` when the body is mapped; returns `scratch`, grown if it
   * had to be. The body's checksum was checked when it was opened.
   */
  def copyStored(b: Int, out: java.io.OutputStream, scratch: Array[Byte]): Array[Byte] = {
    val stored = index(3 * b)
    try body.copyTo(offsets(b), stored, out, scratch)
    catch { case e: InternalError if body.isMapped => throw bad(b, StateFileReader.mappedUnreadable(e), e) }
  }

  /**
   * Checks the body against its checksum again: a mapped file changed since it was opened (cut
   * short, its pages then read as zeros or not at all) fails here with an error naming it.
   */
  def recheck(): Unit = {
    val crc =
      try body.crc()
      catch {
        case e: InternalError if body.isMapped =>
          throw new StateFileException(path, version, StateFileReader.mappedUnreadable(e), e)
      }
    if (crc != bodyCrc) {
      throw new StateFileException(path, version,
        f"it changed since it was opened: its body's CRC-32C is now $crc%08x, not $bodyCrc%08x")
    }
  }

  /** Whether the stored body is mapped from the local file (see [[StateFileReader.openSnapshot]]) rather than on the heap. */
  def isMapped: Boolean = body.isMapped

  /** Memory this holds: the stored body (on the heap or mapped), the index and the dictionary's copy. */
  def heldBytes: Long =
    body.length + 4L * index.length + 8L * offsets.length + (if (dictionary == null) 0 else dictionary.length)

  /**
   * Decompresses bucket `b` and calls `onEntry` with each of its entries
   * (`heapstate.engine.Entry` arrays, a new one each) and the key's hash.
   */
  def read(b: Int)(onEntry: (Array[Byte], Int) => Unit): Unit =
    readRecords(b) { (raw, keyAt, keyLength, valueAt, valueLength, hash) =>
      onEntry(entryAt(raw, keyAt - 5, keyLength, valueLength), hash)
    }

  /**
   * Decompresses bucket `b` and calls `onRecord` with each record where it lies in the decompressed
   * bucket (valid only during the call): the key's and the value's index and length, and the key's
   * hash. Nothing is allocated per record. The same checks as [[read]].
   */
  def readRecords(b: Int)(onRecord: SnapshotBuckets.RecordVisitor): Unit = {
    var n = 0
    val records = scan(b) { (raw, pos, keyLength, valueLength) =>
      n += 1
      val hash = keyHash(raw, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + pos + 5, keyLength)
      if (bucketOf(hash) != b) throw bad(b, s"record $n holds a key of bucket ${bucketOf(hash)}")
      onRecord(raw, pos + 5, keyLength, pos + 9 + keyLength, valueLength, hash)
      false
    }
    if (records != index(3 * b + 2)) { // never -1: the visitor never stops the scan
      throw bad(b, s"it holds $records records, its index says ${index(3 * b + 2)}")
    }
  }

  /**
   * The entry of bucket `b` whose key is the `length` bytes at `base`/`offset`, or null: decompresses
   * the bucket and compares keys, allocating only the entry found. It checks the framing of each
   * record up to that one as [[read]] does; the keys' buckets and the record count are left to
   * [[read]], which every bucket goes through when it loads whole.
   */
  def find(b: Int, base: AnyRef, offset: Long, length: Int): Array[Byte] = {
    var found: Array[Byte] = null
    scan(b) { (raw, pos, keyLength, valueLength) =>
      val hit = keyLength == length && org.apache.spark.unsafe.array.ByteArrayMethods.arrayEquals(
        raw, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + pos + 5, base, offset, length)
      if (hit) found = entryAt(raw, pos, keyLength, valueLength)
      hit
    }
    found
  }

  /** A new entry array of the record at `pos` of a decompressed bucket. */
  private def entryAt(raw: Array[Byte], pos: Int, keyLength: Int, valueLength: Int): Array[Byte] = {
    val entry = new Array[Byte](8 + keyLength + valueLength)
    org.apache.spark.unsafe.Platform.putInt(entry, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET, keyLength)
    org.apache.spark.unsafe.Platform.putInt(entry, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + 4, valueLength)
    System.arraycopy(raw, pos + 5, entry, 8, keyLength)
    System.arraycopy(raw, pos + 9 + keyLength, entry, 8 + keyLength, valueLength)
    entry
  }

  /**
   * Decompresses bucket `b` and calls `visit(raw, position, key length, value length)` with each
   * record in turn, checking its framing, until `visit` returns true. Returns the number of
   * records visited when it went through all of them, or -1 when `visit` stopped it.
   */
  private def scan(b: Int)(visit: (Array[Byte], Int, Int, Int) => Boolean): Int =
    try scanBucket(b, visit)
    catch { case e: InternalError if body.isMapped => throw bad(b, StateFileReader.mappedUnreadable(e), e) }

  private def scanBucket(b: Int, visit: (Array[Byte], Int, Int, Int) => Boolean): Int = {
    val stored = index(3 * b)
    val rawLength = index(3 * b + 1)
    if (index(3 * b + 2) == 0) return 0
    val raw = new Array[Byte](rawLength)
    try {
      val (src, off) = body.slice(offsets(b), stored)
      blocks.blocks.decompress(src, off, stored, raw, rawLength)
    } catch {
      case NonFatal(e) => throw bad(b, s"it does not decompress (${e.getClass.getSimpleName}: ${e.getMessage})", e)
    }
    var pos = 0
    var n = 0
    while (pos < rawLength) {
      if (raw(pos) != RecordPut) throw bad(b, s"record ${n + 1} has type ${raw(pos)}, not a put")
      if (pos + 9L > rawLength) throw bad(b, s"record ${n + 1} runs past the bucket's end")
      val keyLength = getIntBE(raw, pos + 1)
      if (keyLength < 0 || pos + 9L + keyLength > rawLength)
        throw bad(b, s"record ${n + 1} has a key length of $keyLength bytes")
      val valueLength = getIntBE(raw, pos + 5 + keyLength)
      if (valueLength < 0 || pos + 9L + keyLength + valueLength > rawLength) {
        throw bad(b, s"record ${n + 1} has a value length of $valueLength bytes")
      }
      n += 1
      if (visit(raw, pos, keyLength, valueLength)) return -1
      pos += 9 + keyLength + valueLength
    }
    n
  }

  /** The error for damage found in bucket `b`, naming the file, its version and the bucket. */
  private def bad(b: Int, reason: String, cause: Throwable = null) =
    new StateFileException(path, version, s"bucket $b: $reason", cause)

  override def close(): Unit = cleanable.clean()
}

object SnapshotBuckets {
  /** What [[SnapshotBuckets.readRecords]] calls with each record (primitive arguments: no boxing). */
  trait RecordVisitor {
    def apply(raw: Array[Byte], keyAt: Int, keyLength: Int, valueAt: Int, valueLength: Int, hash: Int): Unit
  }

  /**
   * Fills `offsets` with where each bucket of `index` (stored length, raw length, records; three
   * ints a bucket) starts in the body, and returns the first bucket whose entry cannot be right (a
   * negative length or count, or a length or count of zero without the others), or -1.
   */
  private[io] def offsetsOf(index: Array[Int], offsets: Array[Long]): Int = {
    var at = 0L
    var b = 0
    while (b < offsets.length) {
      val stored = index(3 * b)
      val rawLength = index(3 * b + 1)
      val records = index(3 * b + 2)
      if (stored < 0 || rawLength < 0 || records < 0 || (records == 0) != (rawLength == 0) ||
        (rawLength == 0) != (stored == 0)) return b
      offsets(b) = at
      at += stored
      b += 1
    }
    -1
  }

  /** The records of every bucket of `index` (see [[offsetsOf]]). */
  private[io] def recordsIn(index: Array[Int]): Long = {
    var keys = 0L
    var i = 2
    while (i < index.length) { keys += index(i); i += 3 }
    keys
  }

  /** The codec, closed by the cleaner: it must not refer to its [[SnapshotBuckets]]. */
  private[io] final class CodecHolder(val blocks: BlockCodec) extends Runnable {
    override def run(): Unit = blocks.close()
  }
}
