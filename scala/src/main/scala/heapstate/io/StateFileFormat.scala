package heapstate.io

import java.io.{EOFException, FilterOutputStream, InputStream, OutputStream}
import java.nio.ByteBuffer
import java.util.zip.CRC32C

import org.apache.hadoop.fs.Path

/**
 * The layout of heapstate's files; `docs/FORMAT.md` is its specification. This heapstate writes
 * format 2, and format 3 for a snapshot compressed with a dictionary, and reads formats 1 to 3.
 *
 * {{{
 *   header  (24 bytes, uncompressed, big-endian)
 *     magic "HSTF" | format version u16 | kind u8 | codec u8 | state version i64 |
 *     partition i32 | CRC32C of the 20 bytes before it
 *   body of a journal (one stream, compressed with the header's codec)
 *     records: 0x01 PUT keyLen i32, key, valueLen i32, value
 *              0x02 DELETE keyLen i32, key
 *     then:    0x00 END recordCount i64 keyDelta i64     (format 1: no keyDelta)
 *   body of a snapshot, format 2 (bucketed; format 1 snapshots are laid out as journals)
 *     2^bits blocks, each bucket's PUT records compressed on their own, then
 *     the index: per bucket, compressed length i32 | raw length i32 | record count i32,
 *     the footer: key count i64 | bits i32 | magic "HSBI"
 *   body of a snapshot, format 3 (zstd only): as format 2, with a zstd dictionary that every block
 *     was compressed with between the blocks and the index, and its length first in the footer:
 *     dictionary length i32 | key count i64 | bits i32 | magic "HSBI"
 *   trailer (16 bytes, uncompressed)
 *     body length i64 | CRC32C of the stored body u32 | magic "HSTE"
 * }}}
 *
 * A snapshot's key goes to bucket `murmur3_x86_32(key bytes, seed 42) >>> (32 - bits)`, each key
 * once, so that a reader can decompress only the buckets of the keys it needs ([[SnapshotBuckets]]).
 */
object StateFileFormat {
  val Magic: Int = 0x48535446 // "HSTF"
  val EndMagic: Int = 0x48535445 // "HSTE"
  val IndexMagic: Int = 0x48534249 // "HSBI"
  /** The format this heapstate writes (journals, and snapshots without a dictionary). */
  val FormatVersion: Short = 2
  /** The format of a snapshot whose buckets were compressed with a dictionary: format 2's, with it. */
  val DictionaryFormat: Short = 3
  /** The formats this heapstate reads. */
  val ReadableFormats: Seq[Short] = Seq(1, 2, 3)
  val HeaderBytes = 24
  val TrailerBytes = 16
  val FooterBytes = 16
  /** A format-3 footer: format 2's, after the dictionary's length. */
  val DictionaryFooterBytes = 20
  /** The largest dictionary a snapshot may hold; a longer one means a damaged file. */
  val MaxDictionaryBytes: Int = 1 << 20
  /**
   * The size of the zstd dictionary a snapshot's writer trains on its buckets (see
   * `SnapshotFileWriter`): 16 KiB, which on W5-shaped buckets of 1 KiB compressed as well as
   * ones of 8 KiB did, or slightly better (stop 65).
   */
  val DictionaryBytes: Int = 16 * 1024
  val IndexEntryBytes = 12

  val KindJournal: Byte = 1
  val KindSnapshot: Byte = 2

  val RecordEnd: Byte = 0
  val RecordPut: Byte = 1
  val RecordDelete: Byte = 2

  /** No key or value row Spark writes comes near this; a larger length means a damaged file. */
  val MaxRowBytes: Int = 256 * 1024 * 1024
  val BufferBytes: Int = 1 << 16

  /** At most 2^20 buckets: the index stays within 12 MiB, whatever the state's size. */
  val MaxBucketBits = 20

  final case class Header(kind: Byte, codec: Codec, version: Long, partition: Int, format: Short = FormatVersion)

  def kindName(kind: Byte): String = if (kind == KindJournal) "journal" else "snapshot"

  /** The hash of a key's bytes that places it in a snapshot bucket (and in the live table). */
  def keyHash(base: AnyRef, offset: Long, length: Int): Int =
    org.apache.spark.unsafe.hash.Murmur3_x86_32.hashUnsafeBytes(base, offset, length, 42)

  def bucketOf(hash: Int, bits: Int): Int = if (bits == 0) 0 else hash >>> (32 - bits)

  /** The fewest bucket bits that keep a snapshot of `rawBytes` of records at `bucketBytes` or less a bucket. */
  def bucketBitsFor(rawBytes: Long, bucketBytes: Int): Int = {
    var bits = 0
    while (bits < MaxBucketBits && (bucketBytes.toLong << bits) < rawBytes) bits += 1
    bits
  }

  def encodeHeader(h: Header): Array[Byte] = {
    val buf = ByteBuffer.allocate(HeaderBytes)
    buf.putInt(Magic).putShort(h.format).put(h.kind).put(h.codec.id)
    buf.putLong(h.version).putInt(h.partition)
    val crc = new CRC32C
    crc.update(buf.array(), 0, 20)
    buf.putInt(crc.getValue.toInt)
    buf.array()
  }

  def decodeHeader(bytes: Array[Byte], path: Path, version: Long): Header = {
    def bad(reason: String) = new StateFileException(path, version, reason)
    val buf = ByteBuffer.wrap(bytes)
    if (buf.getInt != Magic) throw bad("it does not start with heapstate's magic number \"HSTF\"")
    val format = buf.getShort
    val kind = buf.get
    val codecId = buf.get
    val fileVersion = buf.getLong
    val partition = buf.getInt
    val crc = new CRC32C
    crc.update(bytes, 0, 20)
    if (buf.getInt != crc.getValue.toInt) throw bad("its header checksum does not match")
    if (!ReadableFormats.contains(format)) {
      throw bad(s"it has format version $format; this heapstate reads formats ${ReadableFormats.mkString(", ")}")
    }
    if (kind != KindJournal && kind != KindSnapshot) throw bad(s"unknown file kind $kind")
    if (format == DictionaryFormat && kind != KindSnapshot) {
      throw bad(s"it is a ${kindName(kind)} of format version $format, which only snapshots have")
    }
    val codec = Codec.byId(codecId).getOrElse(throw bad(s"unknown codec id $codecId"))
    if (format == DictionaryFormat && codec != Codec.Zstd) {
      throw bad(s"it is a snapshot of format version $format with codec ${codec.name}; only zstd takes a dictionary")
    }
    if (fileVersion != version) {
      throw bad(s"its header says version $fileVersion, but its name says version $version")
    }
    Header(kind, codec, fileVersion, partition, format)
  }

  private[io] def putIntBE(b: Array[Byte], at: Int, v: Int): Unit = {
    b(at) = (v >>> 24).toByte; b(at + 1) = (v >>> 16).toByte; b(at + 2) = (v >>> 8).toByte; b(at + 3) = v.toByte
  }

  private[io] def getIntBE(b: Array[Byte], at: Int): Int =
    ((b(at) & 0xff) << 24) | ((b(at + 1) & 0xff) << 16) | ((b(at + 2) & 0xff) << 8) | (b(at + 3) & 0xff)

  /** Writes the trailer after a body of `bodyBytes` whose stored bytes have checksum `crc`. */
  private[io] def writeTrailer(raw: OutputStream, bodyBytes: Long, crc: Int): Unit = raw.write(trailer(bodyBytes, crc))

  /** The trailer of a body of `bodyBytes` bytes whose CRC-32C is `crc`. */
  private[io] def trailer(bodyBytes: Long, crc: Int): Array[Byte] =
    ByteBuffer.allocate(TrailerBytes).putLong(bodyBytes).putInt(crc).putInt(EndMagic).array()

  /** Holds native codec state until closed, or until its owner is collected. */
  private[io] val cleaner: java.lang.ref.Cleaner = java.lang.ref.Cleaner.create()
}

/**
 * What reading a whole file found: its header, its record count, and, for a journal of format
 * 2, the number of keys its version added minus those it removed.
 */
final case class FileSummary(header: StateFileFormat.Header, records: Long, keyDelta: Option[Long])

/** Counts and checksums the bytes that pass to `out`; does not close `out`. */
private final class ChecksummedOutput(out: OutputStream) extends FilterOutputStream(out) {
  val crc = new CRC32C
  var count = 0L
  override def write(b: Int): Unit = { out.write(b); crc.update(b); count += 1 }
  override def write(b: Array[Byte], off: Int, len: Int): Unit = {
    out.write(b, off, len); crc.update(b, off, len); count += len
  }
  override def close(): Unit = flush()
}

/** Reads at most `limit` bytes of `in`, checksumming them; does not close `in`. */
private final class ChecksummedInput(in: InputStream, limit: Long) extends InputStream {
  val crc = new CRC32C
  var consumed = 0L
  override def read(): Int = {
    if (consumed >= limit) return -1
    val b = in.read()
    if (b >= 0) { crc.update(b); consumed += 1 }
    b
  }
  override def read(b: Array[Byte], off: Int, len: Int): Int = {
    if (consumed >= limit) return -1
    val n = in.read(b, off, math.min(len.toLong, limit - consumed).toInt)
    if (n > 0) { crc.update(b, off, n); consumed += n }
    n
  }
  /** Reads whatever the decompressor left unread, so the checksum covers the whole body. */
  def drain(): Unit = {
    val buf = new Array[Byte](8192)
    while (read(buf, 0, buf.length) > 0) {}
  }
  override def close(): Unit = ()
}

/**
 * The decompressed body, read through one buffer without `DataInputStream`'s per-byte calls
 * into a synchronized `BufferedInputStream`: recovery reads millions of small fields. Integers are
 * big-endian, as `DataOutputStream` writes them. Running out of bytes is an `EOFException`.
 */
private final class RecordInput(in: InputStream) {
  private val buf = new Array[Byte](StateFileFormat.BufferBytes)
  private var pos = 0
  private var lim = 0

  /** Makes at least `n` (at most the buffer's size) unread bytes available. */
  private def ensure(n: Int): Unit = if (lim - pos < n) {
    System.arraycopy(buf, pos, buf, 0, lim - pos)
    lim -= pos; pos = 0
    while (lim < n) {
      val read = in.read(buf, lim, buf.length - lim)
      if (read < 0) throw new EOFException(s"the body ended $lim bytes into a field of $n bytes")
      lim += read
    }
  }

  def readByte(): Byte = { ensure(1); val b = buf(pos); pos += 1; b }

  def readInt(): Int = {
    ensure(4)
    val v =
      ((buf(pos) & 0xff) << 24) | ((buf(pos + 1) & 0xff) << 16) | ((buf(pos + 2) & 0xff) << 8) | (buf(pos + 3) & 0xff)
    pos += 4
    v
  }

  def readLong(): Long = (readInt().toLong << 32) | (readInt() & 0xffffffffL)

  def readFully(dst: Array[Byte], off: Int, len: Int): Unit =
    if (len <= buf.length) { ensure(len); System.arraycopy(buf, pos, dst, off, len); pos += len }
    else { // a field larger than the buffer: what is buffered, then the rest straight from the stream
      val buffered = lim - pos
      System.arraycopy(buf, pos, dst, off, buffered)
      pos = lim
      var done = buffered
      while (done < len) {
        val read = in.read(dst, off + done, len - done)
        if (read < 0) throw new EOFException(s"the body ended $done bytes into a field of $len bytes")
        done += read
      }
    }
}
