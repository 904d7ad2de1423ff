package heapstate.io

import java.io.{
  BufferedOutputStream,
  DataInputStream,
  DataOutputStream,
  EOFException,
  FilterOutputStream,
  InputStream,
  OutputStream
}
import java.nio.ByteBuffer
import java.util.zip.CRC32C

import scala.util.control.NonFatal

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

/**
 * Writes one journal to `raw`. Call `put`/`putEntry`/`delete` for each record, then `finish`;
 * the caller owns `raw` (an atomic checkpoint stream) and commits or cancels it.
 */
final class StateFileWriter(raw: OutputStream, header: StateFileFormat.Header) {
  import StateFileFormat._
  require(header.kind == KindJournal && header.format == FormatVersion,
    "snapshots are written by SnapshotFileWriter, and only in the current format")

  raw.write(encodeHeader(header))
  private val body = new ChecksummedOutput(raw)
  // Buffered above the codec: record fields are written a few bytes at a time, and a call into
  // the codec's stream per field (for `none`, a checksum update and a file write each) would cost
  // more than the compression. zstd's stream (`DirectZstdOutput`) gathers its own input too, so
  // for zstd this is one more copy of the body, which is small next to compressing it.
  private val out = new DataOutputStream(new BufferedOutputStream(header.codec.compress(body), BufferBytes))
  private var records = 0L

  def put(key: Array[Byte], value: Array[Byte]): Unit = {
    out.writeByte(RecordPut)
    out.writeInt(key.length); out.write(key)
    out.writeInt(value.length); out.write(value)
    records += 1
  }

  /**
   * Writes a put record from an entry array `[key length: i32][value length: i32][key][value]`
   * (see `heapstate.engine.Entry`).
   */
  def putEntry(entry: Array[Byte]): Unit = putEntry(entry, 0)

  /** [[putEntry]] of the entry that starts at index `at` of `b` (a page of the live table's kind). */
  def putEntry(b: Array[Byte], at: Int): Unit = {
    val base = org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET
    val keyLength = org.apache.spark.unsafe.Platform.getInt(b, base + at)
    val valueLength = org.apache.spark.unsafe.Platform.getInt(b, base + at + 4)
    out.writeByte(RecordPut)
    out.writeInt(keyLength); out.write(b, at + 8, keyLength)
    out.writeInt(valueLength); out.write(b, at + 8 + keyLength, valueLength)
    records += 1
  }

  def delete(key: Array[Byte]): Unit = {
    out.writeByte(RecordDelete)
    out.writeInt(key.length); out.write(key)
    records += 1
  }

  def recordCount: Long = records

  /**
   * Ends the body with `keyDelta` (the keys this version added minus those it removed) and
   * writes the trailer; returns the file's total size in bytes.
   */
  def finish(keyDelta: Long): Long = {
    out.writeByte(RecordEnd)
    out.writeLong(records)
    out.writeLong(keyDelta)
    out.close() // finishes the codec frame; ChecksummedOutput keeps `raw` open
    crc = body.crc.getValue.toInt
    writeTrailer(raw, body.count, crc)
    HeaderBytes + body.count + TrailerBytes
  }

  private var crc = 0
  /** The CRC-32C of the body, once [[finish]] wrote it. */
  def bodyCrc: Int = crc
}

/**
 * Writes one snapshot to `raw`, bucketed (see [[StateFileFormat]]). `putEntry` only collects
 * where the entries are (bytes that never change, not copied); `finish` groups them by bucket, drops a key given
 * twice (a snapshot view may emit a key twice, with the same value), compresses each bucket on
 * its own and writes it. Buckets hold at most about `bucketBytes` of records each, before
 * compression. `pace` is called with the bytes of each entry collected and of each bucket
 * written, so that a paced writer spreads both passes out (see `SnapshotPacer`), with no burst of
 * unpaced work between them. The caller owns `raw`.
 *
 * Reusing buckets: given `reuse`, an earlier snapshot of the same state with as many buckets and
 * the same codec, a bucket whose keys no commit changed since is copied from it as stored instead
 * of being filled and compressed again. Its records are the same, in the same order (by hash),
 * so the file is the one a fresh write would make (but for keys of one hash in one bucket, rare,
 * whose order may differ). A bucket holding another number of entries than the earlier one's is
 * compressed afresh all the same: a cheap check against a caller whose account of the changes is
 * wrong (it cannot see a value changed in place). Compression is most of a snapshot's cost, and
 * in W1, where a tenth of the keys change between snapshots, about half of its buckets (2.5 KiB
 * of records each) are unchanged.
 *
 * Putting the changed buckets only: with `reuse.onlyChanged`, the caller puts the entries of the
 * buckets `reuse` names changed alone, and the writer copies every other bucket from `reuse.from`
 * as it holds it, its record count included, with no entries to check it against. The snapshot
 * splits as `reuse.from` does, and must be compressed with its dictionary: when the state's
 * records (those copied and those put) call for another split, or the codec or dictionary
 * differs, [[finish]] throws [[BucketReuse.ChangedOnlyRefused]] before it writes a byte, and the
 * caller puts every entry in a new writer. It throws the same, after the buckets, when the
 * records copied and put are not the state's key count (`reuse.keyCount`): a cheap check against
 * a caller whose account of the changes missed a key added or removed. It is weaker than the
 * per-bucket count of [[writeReusing]]: it cannot see a value changed, in place or not, nor a
 * missed addition in one bucket and a missed removal in another, which cancel out. The file is
 * the one the caller would get with every entry put, when its account of the changes is right.
 * Why: a view of every key reads each key's bytes (the key's hash) in an order the heap does not
 * keep, and the writer sorts them all, for buckets most of which it then copies: at 1M keys of
 * W5's shape the view and the sort were 28% of a snapshot's time (stop 65's profile of
 * `bench/runMain heapstate.bench.SnapshotWrite`), a share that grows with the state, where the
 * changed buckets' keys are as many as the changes.
 *
 * `expectedEntries`, when above 0, is about how many entries the caller will put (a state's key
 * count): the writer's lists of entries are made that long at once, and grow by an eighth (at
 * least 1,024 entries) when it is exceeded, instead of doubling from 1,024. Those lists take 12 bytes an entry, so a store
 * of a million keys needs 12 MB; doubling up to that left about as much again behind as garbage
 * in each snapshot, in arrays G1 allocates as humongous objects from 2 MiB on (a 4 MiB region's
 * half), straight into the old generation, where each allocation is a point at which G1 may start a
 * concurrent marking cycle. The file is the same either way.
 */
final class SnapshotFileWriter(
    raw: OutputStream,
    header: StateFileFormat.Header,
    bucketBytes: Int,
    pace: Int => Unit,
    reuse: BucketReuse = null,
    expectedEntries: Int = 0,
    dictionaryBytes: Int = 0,
    withDictionary: Array[Byte] = null) {
  import StateFileFormat._
  import org.apache.spark.unsafe.Platform.{BYTE_ARRAY_OFFSET => Base}
  require(header.kind == KindSnapshot && header.format == FormatVersion, "a snapshot in the current format")
  require(expectedEntries >= 0, s"expectedEntries $expectedEntries")
  require(dictionaryBytes == 0 || (dictionaryBytes >= 256 && dictionaryBytes <= MaxDictionaryBytes),
    s"dictionaryBytes $dictionaryBytes")
  require(withDictionary == null || header.codec == Codec.Zstd, "a dictionary for zstd alone")

  private val initialEntries = if (expectedEntries > 0) expectedEntries else 1024
  /** Each entry's array and its offset there (see `heapstate.engine.Entry`). */
  private var bases = new Array[Array[Byte]](initialEntries)
  private var offsets = new Array[Int](initialEntries)
  private var hashes = new Array[Int](initialEntries)
  private var count = 0
  private var grown = 0
  /** How many times the lists of entries grew (tests). */
  def growths: Int = grown
  private var rawBytes = 0L
  /** Where [[finish]] leaves what it read ahead, so that the compiler keeps those reads. */
  private var readAheadSum = 0
  /** The sorted positions up to which [[readAhead]] has read the entries' places, and their bytes. */
  private var placesRead, bytesRead = 0

  /**
   * Reads ahead of sorted position `at` (see `SnapshotFileWriter.ReadAhead`): the places (array
   * and offset) of the next `ReadAhead` entries whose places were not read yet, and the first
   * bytes of those whose places were read the time before. Returns what it read, for
   * `readAheadSum`.
   */
  private def readAhead(order: Array[Long], at: Int): Int = {
    if (placesRead < at) { placesRead = at; bytesRead = at } // past buckets copied whole
    var ahead = 0
    var k = bytesRead
    bytesRead = placesRead
    while (k < bytesRead) {
      val j = order(k).toInt
      ahead += org.apache.spark.unsafe.Platform.getInt(bases(j), Base + offsets(j))
      k += 1
    }
    placesRead = math.min(count, placesRead + SnapshotFileWriter.ReadAhead)
    while (k < placesRead) {
      val j = order(k).toInt
      ahead += offsets(j) + (if (bases(j) eq null) 1 else 0)
      k += 1
    }
    ahead
  }

  /**
   * Adds the entry `[key length: i32][value length: i32][key][value]` at offset `at` of `b` (see
   * `heapstate.engine.Entry`), whose key hashes to `hash` ([[StateFileFormat.keyHash]] of its
   * bytes); those bytes must not change.
   */
  def putEntry(b: Array[Byte], at: Int, hash: Int): Unit = {
    if (count == bases.length) grow()
    bases(count) = b
    offsets(count) = at
    hashes(count) = hash
    count += 1
    val length = SnapshotFileWriter.entryLength(b, at)
    rawBytes += 1 + length // the record adds a type byte
    pace(length)
  }

  /**
   * Makes room for more entries: an eighth more (at least 1,024) past `expectedEntries`, twice as
   * many without it.
   */
  private def grow(): Unit = {
    val more = if (expectedEntries > 0) math.max(count >>> 3, 1024) else count
    val n = math.min(count.toLong + more, Int.MaxValue - 8L).toInt
    if (n <= count) {
      throw new IllegalStateException(s"heapstate: the snapshot of version ${header.version} of partition " +
        s"${header.partition} has more than $count entries, more than a snapshot file can hold")
    }
    bases = java.util.Arrays.copyOf(bases, n)
    offsets = java.util.Arrays.copyOf(offsets, n)
    hashes = java.util.Arrays.copyOf(hashes, n)
    grown += 1
  }

  /** Adds an entry array (offset 0); see the other `putEntry`. */
  def putEntry(entry: Array[Byte]): Unit =
    putEntry(entry, 0, keyHash(entry, Base + 8, org.apache.spark.unsafe.Platform.getInt(entry, Base)))

  def put(key: Array[Byte], value: Array[Byte]): Unit = {
    val e = new Array[Byte](8 + key.length + value.length)
    org.apache.spark.unsafe.Platform.putInt(e, Base, key.length)
    org.apache.spark.unsafe.Platform.putInt(e, Base + 4, value.length)
    System.arraycopy(key, 0, e, 8, key.length)
    System.arraycopy(value, 0, e, 8 + key.length, value.length)
    putEntry(e)
  }

  /**
   * After [[finish]]: how many buckets the snapshot has, how many of them were copied from
   * `reuse`, and the CRC-32C of the body (the trailer's).
   */
  var bucketCount = 0
  var reused = 0
  var bodyCrc = 0
  /** After [[finish]]: the dictionary the buckets were compressed with, or null (format 2). */
  var dictionary: Array[Byte] = null
  /** After [[finish]]: whether [[dictionary]] was trained for this snapshot (not taken from `reuse`). */
  var trained = false

  /** The bucket being filled ([[fillBucket]]), and how many records it holds. */
  private var block = new Array[Byte](0)
  private var blockRecords = 0
  /** What [[compressBucket]] compresses into (grown when too small), and the records written so far. */
  private var compressed = new Array[Byte](0)
  private var keys = 0L

  /**
   * Writes the buckets, the index and the trailer; returns the file's total size in bytes.
   *
   * Each step is a method of its own: the loops of one large method were compiled by the JIT as
   * one unit, on-stack, several times over (190 ms of C2's time each, in the batches where a JVM's
   * first snapshots ran). A snapshot that copies from an earlier one ([[writeReusing]]) and one
   * that does not ([[writeFresh]]) run loops of their own: with one loop for both, a JVM whose
   * snapshots had copied (those after its first) compiled that loop for them, and its next fresh
   * snapshot (the first of a new query, or a bulk load) failed the compiled loop's assumptions
   * and had it compiled again, and then again for the copying snapshot after it (136 to 203 ms
   * of C2's time each, at 4M keys in W5, stop 51).
   */
  def finish(): Long = {
    val onlyChanged = reuse != null && reuse.onlyChanged
    val bits = if (onlyChanged) changedOnlyBits() else bucketBitsFor(rawBytes, bucketBytes)
    val base =
      if (reuse != null && reuse.from.bucketBits == bits && reuse.from.codec == header.codec) reuse.from else null
    val wanted = dictionaryBytes > 0 && header.codec == Codec.Zstd
    val kept = if (withDictionary != null) withDictionary else if (wanted && base != null) base.dictionary else null
    if (onlyChanged && (base == null || !SnapshotFileWriter.compressesAs(base, header.codec, dictionaryBytes,
        withDictionary))) {
      throw new BucketReuse.ChangedOnlyRefused(s"snapshot ${reuse.from.version}, which the snapshot of version " +
        s"${header.version} would copy from, has another codec or dictionary (${reuse.from.codec.name}, " +
        s"${if (reuse.from.dictionary == null) "none" else s"${reuse.from.dictionary.length} bytes"})")
    }
    val buckets = 1 << bits
    val starts = bucketStarts(bits)
    val order = sortedByBucket(bits, starts)
    block = new Array[Byte](2 * bucketBytes)
    dictionary = if (kept == null && wanted) train(buckets, starts, order) else kept
    trained = kept == null && dictionary != null
    // A bucket is copied only from a snapshot compressed with the same dictionary, or without one as this.
    val from = if (base != null && java.util.Arrays.equals(base.dictionary, dictionary)) base else null
    raw.write(encodeHeader(if (dictionary == null) header else header.copy(format = DictionaryFormat)))
    val body = new ChecksummedOutput(raw)
    val out = new BufferedOutputStream(body, BufferBytes)
    val index = new Array[Byte](IndexEntryBytes * buckets)
    val codec = header.codec.blocks(dictionary)
    // A read of a mapping cut short faults with an InternalError, which the JVM may deliver a little
    // after the read, from compiled code: anywhere in the copying, or in the check after it.
    try {
      try {
        if (from == null) writeFresh(buckets, starts, order, index, out, codec)
        else if (onlyChanged) writeChangedOnly(from, bits, starts, order, index, out, codec)
        else writeReusing(from, bits, starts, order, index, out, codec)
      } finally codec.close()
      if (reused > 0) {
        try from.recheck()
        catch { case e: StateFileException => throw new BucketReuse.CopyFailed(e) }
      }
    } catch {
      case e: InternalError if from != null && from.isMapped =>
        throw new BucketReuse.CopyFailed(
          new StateFileException(from.path, from.version, StateFileReader.mappedUnreadable(e), e))
    }
    bucketCount = buckets
    if (dictionary != null) out.write(dictionary)
    out.write(index)
    val footer = ByteBuffer.allocate(if (dictionary == null) FooterBytes else DictionaryFooterBytes)
    if (dictionary != null) footer.putInt(dictionary.length)
    footer.putLong(keys).putInt(bits).putInt(IndexMagic)
    out.write(footer.array())
    out.flush()
    bases = null // what the writer collected is no longer needed
    block = null
    compressed = null
    bodyCrc = body.crc.getValue.toInt
    writeTrailer(raw, body.count, bodyCrc)
    HeaderBytes + body.count + TrailerBytes
  }

  /**
   * A zstd dictionary of up to `dictionaryBytes`, trained on up to `DictionarySamples` of the
   * buckets, spread evenly; null when they are too few or too small to train on, or training
   * fails (the snapshot is then written without one, in format 2).
   *
   * Why: compressed on its own, a small bucket compresses badly, and zstd spends most of its time
   * on each block's fixed work (its entropy tables). With a dictionary trained on the state's own
   * records, a bucket of 1 KiB compresses about as well as one of 4 KiB without, and faster a
   * record. Small buckets are what keep a snapshot's work in step with the keys that changed
   * rather than with the state: a snapshot copies every bucket no key changed in, and the smaller
   * the buckets, the more of them no key changed in (see "Reusing buckets" above).
   */
  private def train(buckets: Int, starts: Array[Int], order: Array[Long]): Array[Byte] = {
    val wanted = math.min(buckets, SnapshotFileWriter.DictionarySamples)
    val samples = new java.util.ArrayList[Array[Byte]](wanted)
    var sampled = 0L
    var i = 0
    while (i < wanted && sampled < SnapshotFileWriter.MaxSampleBytes) {
      val b = (i.toLong * buckets / wanted).toInt
      val len = fillBucket(order, starts(b), starts(b + 1))
      if (blockRecords > 0) { samples.add(java.util.Arrays.copyOf(block, len)); sampled += len }
      i += 1
    }
    placesRead = 0; bytesRead = 0 // the buckets are written from the first again
    if (samples.size < SnapshotFileWriter.MinDictionarySamples || sampled < dictionaryBytes) null
    else {
      val trainer = new com.github.luben.zstd.ZstdDictTrainer(Math.toIntExact(sampled), dictionaryBytes)
      samples.forEach(s => trainer.addSample(s))
      try trainer.trainSamples() match {
          case d if d != null && d.length > 0 => d
          case _ => null
        }
      catch { case NonFatal(_) => null } // the samples did not make a dictionary
    }
  }

  /** Fills and compresses every bucket (see [[finish]]). */
  private def writeFresh(
      buckets: Int,
      starts: Array[Int],
      order: Array[Long],
      index: Array[Byte],
      out: OutputStream,
      codec: BlockCodec): Unit = {
    var b = 0
    while (b < buckets) {
      compressBucket(b, starts, order, index, out, codec)
      b += 1
    }
  }

  /**
   * Copies each bucket that `from` holds as it is now from there, and fills and compresses the
   * others (see [[finish]]). A bucket holding another number of entries than `from`'s is
   * compressed afresh (see the class's comment).
   */
  private def writeReusing(
      from: SnapshotBuckets,
      bits: Int,
      starts: Array[Int],
      order: Array[Long],
      index: Array[Byte],
      out: OutputStream,
      codec: BlockCodec): Unit = {
    val buckets = 1 << bits
    var b = 0
    while (b < buckets) {
      val entries = starts(b + 1) - starts(b)
      if (entries == from.recordCount(b) && reuse.unchanged(b, bits)) copyBucket(from, b, entries, index, out)
      else compressBucket(b, starts, order, index, out, codec)
      b += 1
    }
  }

  /**
   * Copies each bucket `reuse` says is unchanged from `from`, whose records it holds (none of them
   * was put), and fills and compresses the others (see "Putting the changed buckets only" in the
   * class comment). The records written, copied and put, must be `reuse.keyCount`; otherwise
   * [[BucketReuse.ChangedOnlyRefused]], after the buckets and before the file's end, and the
   * caller's atomic file is never published.
   */
  private def writeChangedOnly(
      from: SnapshotBuckets,
      bits: Int,
      starts: Array[Int],
      order: Array[Long],
      index: Array[Byte],
      out: OutputStream,
      codec: BlockCodec): Unit = {
    val buckets = 1 << bits
    var b = 0
    while (b < buckets) {
      if (!reuse.unchanged(b, bits)) compressBucket(b, starts, order, index, out, codec)
      else if (starts(b + 1) == starts(b)) copyBucket(from, b, from.recordCount(b), index, out)
      else {
        throw new IllegalStateException(s"heapstate: the snapshot of version ${header.version} of partition " +
          s"${header.partition} was given ${starts(b + 1) - starts(b)} entries of bucket $b, which is unchanged " +
          s"since snapshot ${from.version} and copied from it")
      }
      b += 1
    }
    if (keys != reuse.keyCount) {
      throw new BucketReuse.ChangedOnlyRefused(
        s"the snapshot of version ${header.version} of partition " +
          s"${header.partition} holds $keys records, copied from snapshot ${from.version} and put, where the state " +
          s"holds ${reuse.keyCount} keys: the caller's account of the changes is wrong (most likely, a key was " +
          "added to or removed from a bucket counted unchanged)",
        miscounted = true
      )
    }
  }

  /**
   * With the changed buckets' entries alone: `reuse.from`'s split, which the whole state (the
   * records of the buckets copied from there and the entries put) must call for too, as it would
   * with every entry put; otherwise [[BucketReuse.ChangedOnlyRefused]].
   */
  private def changedOnlyBits(): Int = {
    val from = reuse.from
    val bits = from.bucketBits
    var total = rawBytes
    var b = 0
    while (b < (1 << bits)) {
      if (reuse.unchanged(b, bits)) total += from.rawLength(b)
      b += 1
    }
    val wanted = bucketBitsFor(total, bucketBytes)
    if (wanted != bits) {
      throw new BucketReuse.ChangedOnlyRefused(s"the snapshot of version ${header.version} holds $total bytes of " +
        s"records, for ${1 << wanted} buckets, and snapshot ${from.version}, which it would copy from, has ${1 << bits}")
    }
    bits
  }

  /** Writes bucket `b` of `from`, of `entries` records, as stored there, and its index entry. */
  private def copyBucket(from: SnapshotBuckets, b: Int, entries: Int, index: Array[Byte], out: OutputStream): Unit = {
    // A mapped file cut short since it was opened fails the copy (perhaps only after some bytes
    // were written), or reads as zeros, which the check after the last bucket finds: either way
    // the caller gives up this file and writes the snapshot afresh.
    try compressed = from.copyStored(b, out, compressed)
    catch { case e: StateFileException => throw new BucketReuse.CopyFailed(e) }
    putIntBE(index, IndexEntryBytes * b, from.storedLength(b))
    putIntBE(index, IndexEntryBytes * b + 4, from.rawLength(b))
    putIntBE(index, IndexEntryBytes * b + 8, entries)
    keys += entries
    reused += 1
    pace(from.storedLength(b))
  }

  /** Fills bucket `b` from the sorted entries, compresses and writes it, and its index entry. */
  private def compressBucket(
      b: Int,
      starts: Array[Int],
      order: Array[Long],
      index: Array[Byte],
      out: OutputStream,
      codec: BlockCodec): Unit = {
    val len = fillBucket(order, starts(b), starts(b + 1))
    var stored = 0
    if (blockRecords > 0) {
      val room = codec.maxCompressedLength(len)
      if (compressed.length < room) compressed = new Array[Byte](math.max(room, 2 * compressed.length))
      stored = codec.compress(block, len, compressed)
      out.write(compressed, 0, stored)
    }
    putIntBE(index, IndexEntryBytes * b, stored)
    putIntBE(index, IndexEntryBytes * b + 4, len)
    putIntBE(index, IndexEntryBytes * b + 8, blockRecords)
    keys += blockRecords
    pace(len)
  }

  /** Where each of the `1 << bits` buckets starts in the sorted order, and (last) the entry count. */
  private def bucketStarts(bits: Int): Array[Int] = {
    val buckets = 1 << bits
    val starts = new Array[Int](buckets + 1)
    var i = 0
    while (i < count) { starts(bucketOf(hashes(i), bits) + 1) += 1; i += 1 }
    i = 0
    while (i < buckets) { starts(i + 1) += starts(i); i += 1 }
    starts
  }

  /**
   * The entries in bucket order, and by unsigned hash within a bucket (which puts a repeated key
   * next to its twin): each a long of the hash (high half) and the entry's number (low half). A
   * counting sort by bucket, then a sort of each bucket.
   */
  private def sortedByBucket(bits: Int, starts: Array[Int]): Array[Long] = {
    val order = new Array[Long](count)
    val filled = java.util.Arrays.copyOf(starts, starts.length - 1)
    var i = 0
    while (i < count) {
      val b = bucketOf(hashes(i), bits)
      order(filled(b)) = ((hashes(i) ^ Int.MinValue).toLong << 32) | i
      filled(b) += 1
      i += 1
    }
    var b = 0
    while (b < filled.length) { java.util.Arrays.sort(order, starts(b), starts(b + 1)); b += 1 }
    order
  }

  /**
   * Copies the records of the entries at sorted positions `from` until `to` (one bucket) into
   * `block`, a repeated key once; sets `blockRecords` and returns the bytes written.
   */
  private def fillBucket(order: Array[Long], from: Int, to: Int): Int = {
    var len = 0
    var records = 0
    var ahead = 0
    var i = from
    while (i < to) {
      if (i >= placesRead - 2 * SnapshotFileWriter.ReadAhead) ahead += readAhead(order, i)
      val e = bases(order(i).toInt)
      val o = offsets(order(i).toInt)
      if (!repeated(order, i)) {
        val keyLength = org.apache.spark.unsafe.Platform.getInt(e, Base + o)
        val valueLength = org.apache.spark.unsafe.Platform.getInt(e, Base + o + 4)
        val need = len + 9 + keyLength + valueLength
        if (need > block.length) block = java.util.Arrays.copyOf(block, math.max(need, block.length * 2))
        block(len) = RecordPut
        putIntBE(block, len + 1, keyLength)
        System.arraycopy(e, o + 8, block, len + 5, keyLength)
        putIntBE(block, len + 5 + keyLength, valueLength)
        System.arraycopy(e, o + 8 + keyLength, block, len + 9 + keyLength, valueLength)
        len = need
        records += 1
      }
      i += 1
    }
    readAheadSum += ahead
    blockRecords = records
    len
  }

  /**
   * Whether the entry at sorted position `i` repeats the key of one before it (same hash, same
   * key). The hashes are read from `order` (its high halves), which is read in sequence anyway.
   */
  private def repeated(order: Array[Long], i: Int): Boolean = {
    val h = order(i) >>> 32
    var j = i - 1
    if (j < 0 || (order(j) >>> 32) != h) return false
    val e = bases(order(i).toInt)
    val eAt = offsets(order(i).toInt)
    val keyLength = org.apache.spark.unsafe.Platform.getInt(e, Base + eAt)
    while (j >= 0 && (order(j) >>> 32) == h) {
      val o = bases(order(j).toInt)
      val oAt = offsets(order(j).toInt)
      if (org.apache.spark.unsafe.Platform.getInt(o, Base + oAt) == keyLength &&
        org.apache.spark.unsafe.array.ByteArrayMethods.arrayEquals(e, Base + eAt + 8, o, Base + oAt + 8, keyLength))
        return true
      j -= 1
    }
    false
  }
}

/**
 * What a snapshot may copy from an earlier one of the same state (see "Reusing buckets" in
 * [[SnapshotFileWriter]]): that snapshot, opened, and `unchanged(b, bits)`: whether no commit
 * since it changed a key of bucket `b` of `1 << bits`. The caller closes `from`.
 *
 * With `onlyChanged`, the writer is given the entries of the changed buckets alone (of `from`'s
 * split), and copies every other bucket from `from` without a look at its keys; `keyCount` is
 * then the number of keys the snapshot's version holds, which the file's records must add up to
 * (see "Putting the changed buckets only" in [[SnapshotFileWriter]]).
 */
final class BucketReuse(val from: SnapshotBuckets, val unchanged: (Int, Int) => Boolean,
    val onlyChanged: Boolean = false, val keyCount: Long = -1) {
  require(!onlyChanged || keyCount >= 0,
    s"a write of the changed buckets alone is given the state's key count, not $keyCount")
}

object BucketReuse {
  /** Copying from the earlier snapshot failed (its file changed since it was opened); write afresh. */
  final class CopyFailed(cause: StateFileException) extends java.io.IOException(cause.getMessage, cause)

  /**
   * Given the changed buckets' entries alone, the writer could not copy the others: the state now
   * calls for another split than the earlier snapshot's, or another dictionary; or, `miscounted`,
   * the records copied and put are not the state's key count, so the caller's account of the
   * changes is wrong. Nothing was written that stays; the caller writes the snapshot again with
   * every entry.
   */
  final class ChangedOnlyRefused(message: String, val miscounted: Boolean = false)
      extends java.io.IOException(message)
}

object SnapshotFileWriter {
  /**
   * Whether a writer of `codec` with `dictionaryBytes` (and `withDictionary`, when given)
   * compresses its buckets as `from` did, before it trains anything: the same codec, and the
   * dictionary it keeps is `from`'s, or neither has one. What a writer given the changed buckets
   * alone requires (see "Putting the changed buckets only" in [[SnapshotFileWriter]]), and what
   * the engine checks before it views them.
   */
  def compressesAs(from: SnapshotBuckets, codec: Codec, dictionaryBytes: Int,
      withDictionary: Array[Byte] = null): Boolean = from.codec == codec && {
    val wanted = dictionaryBytes > 0 && codec == Codec.Zstd
    val kept = if (withDictionary != null) withDictionary else if (wanted) from.dictionary else null
    !(kept == null && wanted) && java.util.Arrays.equals(from.dictionary, kept)
  }

  /**
   * How far ahead of the entry it copies [[SnapshotFileWriter.finish]] reads. The entries come in
   * hash order, scattered over the heap, and so do their places (array and offset) in the writer's
   * lists, which are in the view's order: copying an entry waits on up to three cache misses in a
   * row (its place in the lists, then its bytes), and Java has no prefetch instruction.
   *
   * So the writer reads ahead in groups of `ReadAhead` entries, in loops that do nothing else:
   * the places of a group two groups on, then the first bytes of the group after the one it
   * copies, whose places are now in the cache. The reads of one group do not wait on one another,
   * so the processor has many misses in flight at once, where a read ahead inside the copying
   * loop had one or two.
   *
   * A 1M-key store of W5's shape (`bench/runMain heapstate.bench.SnapshotWrite --keys 1000000
   * --updates 2500 --payload 64 --interval 10 --runs 5`, three rounds alternating, stop 63): a
   * snapshot took 786, 910 and 795 ms, against 914, 952 and 971 with reads one entry at a time
   * of its place 24 and its bytes 12 entries on, and 1,001, 1,141 and 1,118 with only its bytes
   * read 12 entries on (since `dab47db`, where it had saved a sixth of a W1 store's snapshot).
   */
  private val ReadAhead = 16

  /** How many buckets a dictionary is trained on, at most (see `SnapshotFileWriter.train`), and at least. */
  private val DictionarySamples = 256
  private val MinDictionarySamples = 16
  private val MaxSampleBytes = 64L << 20

  /** The length of the entry at `b`/`at`, its header included. */
  private def entryLength(b: Array[Byte], at: Int): Int = {
    val base = org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + at
    8 + org.apache.spark.unsafe.Platform.getInt(b, base) + org.apache.spark.unsafe.Platform.getInt(b, base + 4)
  }
}

/**
 * Reads one state file and hands its records to `onPut`/`onDelete` in file order. Every check is
 * made (header, lengths, record count, body checksum, trailer); the records of a journal or a
 * format-1 snapshot are delivered before the checksum at the end is known, so callers build into
 * a staging structure and use it only when `read` returns normally. Any failure becomes a
 * [[StateFileException]] naming the file.
 */
object StateFileReader {
  import StateFileFormat._

  def read(
      in: InputStream,
      fileLength: Long,
      path: Path,
      version: Long,
      expectedKind: Byte,
      onPut: (Array[Byte], Array[Byte]) => Unit,
      onDelete: Array[Byte] => Unit): FileSummary =
    readRecords(in, fileLength, path, version, expectedKind, Left(onPut), onDelete)

  /**
   * Like [[read]], but hands each put record over as one entry array,
   * `[key length: i32][value length: i32][key][value]` (`heapstate.engine.Entry`'s layout), read straight into
   * place: recovery allocates one array per key instead of three.
   */
  def readEntries(
      in: InputStream,
      fileLength: Long,
      path: Path,
      version: Long,
      expectedKind: Byte,
      onEntry: Array[Byte] => Unit,
      onDelete: Array[Byte] => Unit): FileSummary =
    readRecords(in, fileLength, path, version, expectedKind, Right(onEntry), onDelete)

  /**
   * Opens a snapshot for reading bucket by bucket: reads the whole file, checks its header,
   * checksum, trailer and index, and keeps its stored body. `None` for a format-1 snapshot,
   * which has no buckets (read it with [[readEntries]]).
   *
   * `local`, the same file on the local disk, when there is one: its body is then mapped
   * read-only instead of copied onto the heap (see [[ChunkedBytes.map]]). `in` still reads the
   * header.
   */
  def openSnapshot(
      in: InputStream, fileLength: Long, path: Path, version: Long, local: Option[java.io.File] = None)
      : Option[SnapshotBuckets] =
    guarded(path, version) {
      val (data, header) = readHeader(in, fileLength, path, version, KindSnapshot)
      if (header.format == 1) None
      else Some(readBuckets(in, data, fileLength, header, path, version, local))
    }

  private def bad(path: Path, version: Long, reason: String, cause: Throwable = null) =
    new StateFileException(path, version, reason, cause)

  /**
   * The reason for the `InternalError` the JVM throws when a read of a mapped snapshot faults:
   * the file was cut short after it was mapped.
   */
  private[io] def mappedUnreadable(e: InternalError): String =
    s"its mapped bytes cannot be read: the file changed after it was opened (${e.getMessage})"

  /** Runs `body`, turning every failure into a [[StateFileException]] that names the file. */
  private def guarded[T](path: Path, version: Long)(body: => T): T =
    try body
    catch {
      case e: StateFileException => throw e
      case e: EOFException => throw bad(path, version, "it is truncated", e)
      case NonFatal(e) => throw bad(path, version, s"it is damaged (${e.getClass.getSimpleName}: ${e.getMessage})", e)
    }

  private def readHeader(
      in: InputStream, fileLength: Long, path: Path, version: Long, expectedKind: Byte): (DataInputStream, Header) = {
    if (fileLength - HeaderBytes - TrailerBytes < 0) {
      throw bad(path, version, s"it is truncated ($fileLength bytes, shorter than a header and trailer)")
    }
    val data = new DataInputStream(in)
    val headerBytes = new Array[Byte](HeaderBytes)
    data.readFully(headerBytes)
    val header = decodeHeader(headerBytes, path, version)
    if (header.kind != expectedKind) {
      throw bad(path, version, s"it is a ${kindName(header.kind)}, expected a ${kindName(expectedKind)}")
    }
    (data, header)
  }

  /** Checks the trailer that follows a body of `bodyLength` bytes whose checksum was `crc`. */
  private def checkTrailer(data: DataInputStream, bodyLength: Long, crc: Int, path: Path, version: Long): Unit = {
    val trailer = new Array[Byte](TrailerBytes)
    data.readFully(trailer)
    checkTrailer(ByteBuffer.wrap(trailer), bodyLength, crc, path, version)
  }

  /** [[checkTrailer]] of the trailer's `TrailerBytes` bytes in `t`. */
  private def checkTrailer(t: ByteBuffer, bodyLength: Long, crc: Int, path: Path, version: Long): Unit = {
    val writtenLength = t.getLong
    val writtenCrc = t.getInt
    if (t.getInt != EndMagic) throw bad(path, version, "its trailer is damaged (no end magic)")
    if (writtenLength != bodyLength) {
      throw bad(path, version, s"its trailer records a body of $writtenLength bytes, the file holds $bodyLength")
    }
    if (writtenCrc != crc) throw bad(path, version, "its body checksum does not match")
  }

  private def readRecords(
      in: InputStream,
      fileLength: Long,
      path: Path,
      version: Long,
      expectedKind: Byte,
      onPut: Either[(Array[Byte], Array[Byte]) => Unit, Array[Byte] => Unit],
      onDelete: Array[Byte] => Unit): FileSummary = guarded(path, version) {
    val (data, header) = readHeader(in, fileLength, path, version, expectedKind)
    if (header.kind == KindSnapshot && header.format >= 2) {
      val buckets = readBuckets(in, data, fileLength, header, path, version, local = None)
      try {
        var b = 0
        while (b < buckets.buckets) {
          buckets.read(b) { (entry, _) =>
            onPut match {
              case Left(f) =>
                val keyLength =
                  org.apache.spark.unsafe.Platform.getInt(entry, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET)
                f(java.util.Arrays.copyOfRange(entry, 8, 8 + keyLength),
                  java.util.Arrays.copyOfRange(entry, 8 + keyLength, entry.length))
              case Right(f) => f(entry)
            }
          }
          b += 1
        }
      } finally buckets.close()
      FileSummary(header, buckets.keyCount, None)
    } else {
      val bodyLength = fileLength - HeaderBytes - TrailerBytes
      val body = new ChecksummedInput(in, bodyLength)
      val records = new RecordInput(header.codec.decompress(body))
      def readLength(what: String): Int = {
        val len = records.readInt()
        if (len < 0 || len > MaxRowBytes) throw bad(path, version, s"a $what length of $len bytes is impossible")
        len
      }
      def readRow(what: String): Array[Byte] = {
        val row = new Array[Byte](readLength(what))
        records.readFully(row, 0, row.length)
        row
      }
      var keyScratch = new Array[Byte](64)
      def readEntry(): Array[Byte] = {
        val keyLength = readLength("key")
        if (keyScratch.length < keyLength) keyScratch = new Array[Byte](keyLength)
        records.readFully(keyScratch, 0, keyLength)
        val valueLength = readLength("value")
        val entry = new Array[Byte](8 + keyLength + valueLength)
        org.apache.spark.unsafe.Platform.putInt(entry, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET, keyLength)
        org.apache.spark.unsafe.Platform.putInt(entry, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + 4,
          valueLength)
        System.arraycopy(keyScratch, 0, entry, 8, keyLength)
        records.readFully(entry, 8 + keyLength, valueLength)
        entry
      }
      var count = 0L
      var keyDelta: Option[Long] = None
      var done = false
      while (!done) {
        records.readByte() match {
          case RecordPut =>
            onPut match {
              case Left(f) => val key = readRow("key"); f(key, readRow("value"))
              case Right(f) => f(readEntry())
            }
            count += 1
          case RecordDelete =>
            if (header.kind == KindSnapshot) throw bad(path, version, "a snapshot holds a delete record")
            onDelete(readRow("key")); count += 1
          case RecordEnd =>
            val expected = records.readLong()
            if (expected != count) throw bad(path, version, s"it holds $count records but says $expected")
            if (header.kind == KindJournal && header.format >= 2) keyDelta = Some(records.readLong())
            done = true
          case other => throw bad(path, version, s"unknown record type $other after $count records")
        }
      }
      body.drain()
      if (body.consumed != bodyLength)
        throw bad(path, version, s"its body ended after ${body.consumed} of $bodyLength bytes")
      checkTrailer(data, bodyLength, body.crc.getValue.toInt, path, version)
      FileSummary(header, count, keyDelta)
    }
  }

  /** Reads a format-2 snapshot's body (after its header) and trailer, checks them and its index. */
  private def readBuckets(
      in: InputStream,
      data: DataInputStream,
      fileLength: Long,
      header: Header,
      path: Path,
      version: Long,
      local: Option[java.io.File]): SnapshotBuckets = {
    // A read of a mapping faults (an InternalError from the JVM) when the file was cut short
    // after it was mapped; nothing else here throws one.
    def check(): SnapshotBuckets = {
      val bodyLength = fileLength - HeaderBytes - TrailerBytes
      val (body, bodyCrc) = local match {
        case Some(file) =>
          val channel = java.nio.channels.FileChannel.open(file.toPath)
          try {
            val size = channel.size()
            if (size != fileLength)
              throw bad(path, version, s"it changed while being read ($size bytes, listed with $fileLength)")
            val (mapped, crc) = ChunkedBytes.map(channel, HeaderBytes, bodyLength)
            val trailer = ByteBuffer.allocate(TrailerBytes)
            while (trailer.hasRemaining && channel.read(trailer, HeaderBytes + bodyLength + trailer.position()) >= 0) {}
            if (trailer.hasRemaining) throw new EOFException(s"the trailer ended after ${trailer.position()} bytes")
            checkTrailer(trailer.flip(), bodyLength, crc, path, version)
            (mapped, crc)
          } finally channel.close() // the mappings outlive the channel
        case None =>
          val checked = new ChecksummedInput(in, bodyLength)
          val read = ChunkedBytes.read(checked, bodyLength)
          checkTrailer(data, bodyLength, checked.crc.getValue.toInt, path, version)
          (read, checked.crc.getValue.toInt)
      }
      def broken(reason: String) = bad(path, version, s"its snapshot index is damaged: $reason")
      val withDictionary = header.format == DictionaryFormat
      val footerBytes = if (withDictionary) DictionaryFooterBytes else FooterBytes
      if (bodyLength < footerBytes) throw broken(s"a body of $bodyLength bytes has no room for it")
      val keyCount = body.getLong(bodyLength - FooterBytes)
      val bits = body.getInt(bodyLength - 8)
      if (body.getInt(bodyLength - 4) != IndexMagic) throw broken("no index magic")
      if (bits < 0 || bits > MaxBucketBits) throw broken(s"$bits bucket bits")
      val dictionaryLength = if (withDictionary) body.getInt(bodyLength - DictionaryFooterBytes) else 0
      if (withDictionary && (dictionaryLength < 1 || dictionaryLength > MaxDictionaryBytes)) {
        throw broken(s"a dictionary of $dictionaryLength bytes")
      }
      val buckets = 1 << bits
      val indexStart = bodyLength - footerBytes - IndexEntryBytes.toLong * buckets
      if (indexStart < 0) throw broken(s"$buckets buckets do not fit in a body of $bodyLength bytes")
      val blocksEnd = indexStart - dictionaryLength
      if (blocksEnd < 0) {
        throw broken(s"$buckets buckets and a dictionary of $dictionaryLength bytes do not fit in a body of " +
          s"$bodyLength bytes")
      }
      // The index's entries are the three ints `index` holds for each bucket, in the same order:
      // read in one go, not int by int through the chunks (a loop the JIT compiled at length, in
      // the batch that first opened a snapshot to copy from it).
      val index = new Array[Int](3 * buckets)
      val (indexBytes, indexAt) = body.slice(indexStart, IndexEntryBytes * buckets)
      ByteBuffer.wrap(indexBytes, indexAt, IndexEntryBytes * buckets).asIntBuffer().get(index)
      val offsets = new Array[Long](buckets)
      val wrong = SnapshotBuckets.offsetsOf(index, offsets)
      if (wrong >= 0) {
        throw broken(s"bucket $wrong has stored length ${index(3 * wrong)}, raw length ${index(3 * wrong + 1)} " +
          s"and ${index(3 * wrong + 2)} records")
      }
      val at = if (buckets == 0) 0L else offsets(buckets - 1) + index(3 * (buckets - 1))
      val keys = SnapshotBuckets.recordsIn(index)
      if (at != blocksEnd) throw broken(s"its buckets add up to $at bytes, but they take $blocksEnd")
      if (keys != keyCount) throw broken(s"its buckets hold $keys records, but it says $keyCount keys")
      val dictionary =
        if (!withDictionary) null
        else {
          val (bytes, from) = body.slice(blocksEnd, dictionaryLength)
          java.util.Arrays.copyOfRange(bytes, from, from + dictionaryLength)
        }
      new SnapshotBuckets(path, version, header, body, bodyCrc, bits, index, offsets, keyCount, dictionary)
    }
    try check()
    catch { case e: InternalError if local.isDefined => throw bad(path, version, mappedUnreadable(e), e) }
  }
}

/**
 * A body held in chunks of at most 64 MiB, so that any size fits (an array or a mapping holds
 * under 2 GiB): arrays read from a stream ([[ChunkedBytes.read]]), or read-only mappings of a local
 * file ([[ChunkedBytes.map]]). Reading a mapping past the end of a file cut short since makes
 * the JVM throw an `InternalError` (possibly a little later, from compiled code); the readers turn
 * it into a [[StateFileException]] (see [[StateFileReader.mappedUnreadable]]).
 */
private[io] final class ChunkedBytes private (chunks: Array[ByteBuffer], val length: Long) {
  import ChunkedBytes.{ChunkShift, OffsetMask}

  /** Whether the bytes are a mapping of a file rather than arrays on the heap. */
  def isMapped: Boolean = chunks.exists(_.isDirect)

  private def byte(pos: Long): Int = chunks((pos >>> ChunkShift).toInt).get((pos & OffsetMask).toInt) & 0xff

  def getInt(pos: Long): Int = (byte(pos) << 24) | (byte(pos + 1) << 16) | (byte(pos + 2) << 8) | byte(pos + 3)
  def getLong(pos: Long): Long = (getInt(pos).toLong << 32) | (getInt(pos + 4) & 0xffffffffL)

  /** The CRC-32C of all the bytes, read again. */
  def crc(): Int = {
    val crc = new CRC32C
    chunks.foreach(c => crc.update(c.duplicate()))
    crc.getValue.toInt
  }

  /**
   * Writes the `len` bytes at `pos` to `out`: straight from a chunk's own array, or from a mapping
   * through `scratch` (grown when too small, and returned).
   */
  def copyTo(pos: Long, len: Int, out: java.io.OutputStream, scratch: Array[Byte]): Array[Byte] = {
    val chunk = chunks((pos >>> ChunkShift).toInt)
    val off = (pos & OffsetMask).toInt
    if (chunk.hasArray && off + len <= chunk.limit) { out.write(chunk.array, chunk.arrayOffset + off, len); scratch }
    else {
      val buffer = if (scratch.length >= len) scratch else new Array[Byte](math.max(len, 2 * scratch.length))
      gather(pos, len, buffer)
      out.write(buffer, 0, len)
      buffer
    }
  }

  /**
   * An array and offset that hold the `len` bytes at `pos`: a chunk's own array where they lie in
   * one chunk read from a stream, else a copy.
   */
  def slice(pos: Long, len: Int): (Array[Byte], Int) = {
    val chunk = chunks((pos >>> ChunkShift).toInt)
    val off = (pos & OffsetMask).toInt
    if (chunk.hasArray && off + len <= chunk.limit) (chunk.array, chunk.arrayOffset + off)
    else {
      val copy = new Array[Byte](len)
      gather(pos, len, copy)
      (copy, 0)
    }
  }

  /** Copies the `len` bytes at `pos` to the start of `dst`, chunk by chunk. */
  private def gather(pos: Long, len: Int, dst: Array[Byte]): Unit = {
    var done = 0
    while (done < len) {
      val c = chunks(((pos + done) >>> ChunkShift).toInt)
      val o = ((pos + done) & OffsetMask).toInt
      val n = math.min(len - done, c.limit - o)
      c.get(o, dst, done, n)
      done += n
    }
  }
}

private[io] object ChunkedBytes {
  private val ChunkShift = 26
  private val OffsetMask = (1L << ChunkShift) - 1

  private def chunkCount(length: Long): Int = ((length + (1L << ChunkShift) - 1) >>> ChunkShift).toInt
  private def chunkLength(length: Long, c: Int): Int =
    math.min(1L << ChunkShift, length - (c.toLong << ChunkShift)).toInt

  /**
   * Reads exactly `length` bytes of `in`; running out is an `EOFException`. It asks for at most
   * 64 KiB at a time: Hadoop's checksummed local streams serve one large read three times slower
   * than the same bytes in 64 KiB reads (24 against 7.5 ms for a 37 MB snapshot, measured).
   */
  def read(in: InputStream, length: Long): ChunkedBytes = {
    val chunks = Array.tabulate(chunkCount(length)) { c =>
      val chunk = new Array[Byte](chunkLength(length, c))
      var done = 0
      while (done < chunk.length) {
        val got = in.read(chunk, done, math.min(chunk.length - done, StateFileFormat.BufferBytes))
        if (got < 0) throw new EOFException(s"the body ended ${(c.toLong << ChunkShift) + done} bytes into $length")
        done += got
      }
      ByteBuffer.wrap(chunk)
    }
    new ChunkedBytes(chunks, length)
  }

  /**
   * Maps the `length` bytes of `channel` from `start`, read-only, and returns them with their
   * CRC-32C. Nothing is copied onto the heap: the pages stay the file's, in the page cache, which
   * a snapshot just written or read usually already holds. Against [[read]] on a 37 MB snapshot,
   * in a fresh JVM with two threads opening one each: 13 to 24 ms against 35 to 46.
   */
  def map(channel: java.nio.channels.FileChannel, start: Long, length: Long): (ChunkedBytes, Int) = {
    val crc = new CRC32C
    val chunks: Array[ByteBuffer] = Array.tabulate(chunkCount(length)) { c =>
      val m = channel.map(java.nio.channels.FileChannel.MapMode.READ_ONLY, start + (c.toLong << ChunkShift),
        chunkLength(length, c))
      crc.update(m.duplicate())
      m
    }
    (new ChunkedBytes(chunks, length), crc.getValue.toInt)
  }
}

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
