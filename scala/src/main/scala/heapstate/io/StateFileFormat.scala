package heapstate.io

import java.io.{BufferedOutputStream, DataInputStream, DataOutputStream, EOFException, FilterOutputStream, InputStream, OutputStream}
import java.nio.ByteBuffer
import java.util.zip.CRC32C

import scala.util.control.NonFatal

import org.apache.hadoop.fs.Path

/**
 * The layout shared by journals and snapshots; `docs/FORMAT.md` is its specification.
 *
 * {{{
 *   header  (24 bytes, uncompressed, big-endian)
 *     magic "HSTF" | format version u16 | kind u8 | codec u8 | state version i64 |
 *     partition i32 | CRC32C of the 20 bytes before it
 *   body    (compressed with the header's codec)
 *     records: 0x01 PUT keyLen i32, key, valueLen i32, value
 *              0x02 DELETE keyLen i32, key
 *     then:    0x00 END recordCount i64
 *   trailer (16 bytes, uncompressed)
 *     body length i64 | CRC32C of the compressed body u32 | magic "HSTE"
 * }}}
 */
object StateFileFormat {
  val Magic: Int = 0x48535446 // "HSTF"
  val EndMagic: Int = 0x48535445 // "HSTE"
  val FormatVersion: Short = 1
  val HeaderBytes = 24
  val TrailerBytes = 16

  val KindJournal: Byte = 1
  val KindSnapshot: Byte = 2

  val RecordEnd: Byte = 0
  val RecordPut: Byte = 1
  val RecordDelete: Byte = 2

  /** No key or value row Spark writes comes near this; a larger length means a damaged file. */
  val MaxRowBytes: Int = 256 * 1024 * 1024
  val BufferBytes: Int = 1 << 16

  final case class Header(kind: Byte, codec: Codec, version: Long, partition: Int)

  def kindName(kind: Byte): String = if (kind == KindJournal) "journal" else "snapshot"

  def encodeHeader(h: Header): Array[Byte] = {
    val buf = ByteBuffer.allocate(HeaderBytes)
    buf.putInt(Magic).putShort(FormatVersion).put(h.kind).put(h.codec.id)
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
    if (format != FormatVersion) {
      throw bad(s"it has format version $format; this heapstate reads format $FormatVersion")
    }
    if (kind != KindJournal && kind != KindSnapshot) throw bad(s"unknown file kind $kind")
    val codec = Codec.byId(codecId).getOrElse(throw bad(s"unknown codec id $codecId"))
    if (fileVersion != version) {
      throw bad(s"its header says version $fileVersion, but its name says version $version")
    }
    Header(kind, codec, fileVersion, partition)
  }
}

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
    val v = ((buf(pos) & 0xff) << 24) | ((buf(pos + 1) & 0xff) << 16) | ((buf(pos + 2) & 0xff) << 8) | (buf(pos + 3) & 0xff)
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
 * Writes one state file to `raw`. Call `put`/`delete` for each record, then `finish()`; the
 * caller owns `raw` (an atomic checkpoint stream) and commits or cancels it.
 */
final class StateFileWriter(raw: OutputStream, header: StateFileFormat.Header) {
  import StateFileFormat._

  raw.write(encodeHeader(header))
  private val body = new ChecksummedOutput(raw)
  // Buffered above the codec: record fields are written a few bytes at a time, and a codec call
  // (a JNI call for zstd) per field would cost more than the compression itself.
  private val out = new DataOutputStream(new BufferedOutputStream(header.codec.compress(body), BufferBytes))
  private var records = 0L

  def put(key: Array[Byte], value: Array[Byte]): Unit = {
    out.writeByte(RecordPut)
    out.writeInt(key.length); out.write(key)
    out.writeInt(value.length); out.write(value)
    records += 1
  }

  /** Writes a put record from an entry `[key length: i32][key][value]` (see `heapstate.engine.Entry`). */
  def putEntry(entry: Array[Byte]): Unit = {
    val keyLength = org.apache.spark.unsafe.Platform.getInt(entry, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET)
    out.writeByte(RecordPut)
    out.writeInt(keyLength); out.write(entry, 4, keyLength)
    out.writeInt(entry.length - 4 - keyLength); out.write(entry, 4 + keyLength, entry.length - 4 - keyLength)
    records += 1
  }

  def delete(key: Array[Byte]): Unit = {
    out.writeByte(RecordDelete)
    out.writeInt(key.length); out.write(key)
    records += 1
  }

  def recordCount: Long = records

  /** Ends the body and writes the trailer; returns the file's total size in bytes. */
  def finish(): Long = {
    out.writeByte(RecordEnd)
    out.writeLong(records)
    out.close() // finishes the codec frame; ChecksummedOutput keeps `raw` open
    val trailer = ByteBuffer.allocate(TrailerBytes)
    trailer.putLong(body.count).putInt(body.crc.getValue.toInt).putInt(EndMagic)
    raw.write(trailer.array())
    HeaderBytes + body.count + TrailerBytes
  }
}

/**
 * Reads one state file and hands its records to `onPut`/`onDelete` in file order. Every check is
 * made (header, lengths, record count, body checksum, trailer); the records are delivered before
 * the checksum at the end is known, so callers build into a staging structure and use it only
 * when `read` returns normally. Any failure becomes a [[StateFileException]] naming the file.
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
      onDelete: Array[Byte] => Unit): Header =
    readRecords(in, fileLength, path, version, expectedKind, Left(onPut), onDelete)

  /**
   * Like [[read]], but hands each put record over as one entry array,
   * `[key length: i32][key][value]` (`heapstate.engine.Entry`'s layout), read straight into
   * place: recovery allocates one array per key instead of three.
   */
  def readEntries(
      in: InputStream,
      fileLength: Long,
      path: Path,
      version: Long,
      expectedKind: Byte,
      onEntry: Array[Byte] => Unit,
      onDelete: Array[Byte] => Unit): Header =
    readRecords(in, fileLength, path, version, expectedKind, Right(onEntry), onDelete)

  private def readRecords(
      in: InputStream,
      fileLength: Long,
      path: Path,
      version: Long,
      expectedKind: Byte,
      onPut: Either[(Array[Byte], Array[Byte]) => Unit, Array[Byte] => Unit],
      onDelete: Array[Byte] => Unit): Header = {
    def bad(reason: String, cause: Throwable = null) =
      new StateFileException(path, version, reason, cause)
    try {
      val bodyLength = fileLength - HeaderBytes - TrailerBytes
      if (bodyLength < 0) throw bad(s"it is truncated ($fileLength bytes, shorter than a header and trailer)")
      val data = new DataInputStream(in)
      val headerBytes = new Array[Byte](HeaderBytes)
      data.readFully(headerBytes)
      val header = decodeHeader(headerBytes, path, version)
      if (header.kind != expectedKind) {
        throw bad(s"it is a ${kindName(header.kind)}, expected a ${kindName(expectedKind)}")
      }
      val body = new ChecksummedInput(in, bodyLength)
      val records = new RecordInput(header.codec.decompress(body))
      def readLength(what: String): Int = {
        val len = records.readInt()
        if (len < 0 || len > MaxRowBytes) throw bad(s"a $what length of $len bytes is impossible")
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
        val entry = new Array[Byte](4 + keyLength + valueLength)
        org.apache.spark.unsafe.Platform.putInt(entry, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET, keyLength)
        System.arraycopy(keyScratch, 0, entry, 4, keyLength)
        records.readFully(entry, 4 + keyLength, valueLength)
        entry
      }
      var count = 0L
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
            onDelete(readRow("key")); count += 1
          case RecordEnd =>
            val expected = records.readLong()
            if (expected != count) throw bad(s"it holds $count records but says $expected")
            done = true
          case other => throw bad(s"unknown record type $other after $count records")
        }
      }
      body.drain()
      if (body.consumed != bodyLength) throw bad(s"its body ended after ${body.consumed} of $bodyLength bytes")
      val trailer = new Array[Byte](TrailerBytes)
      data.readFully(trailer)
      val t = ByteBuffer.wrap(trailer)
      val writtenLength = t.getLong
      val writtenCrc = t.getInt
      if (t.getInt != EndMagic) throw bad("its trailer is damaged (no end magic)")
      if (writtenLength != bodyLength) {
        throw bad(s"its trailer records a body of $writtenLength bytes, the file holds $bodyLength")
      }
      if (writtenCrc != body.crc.getValue.toInt) throw bad("its body checksum does not match")
      header
    } catch {
      case e: StateFileException => throw e
      case e: EOFException => throw bad("it is truncated", e)
      case NonFatal(e) => throw bad(s"it is damaged (${e.getClass.getSimpleName}: ${e.getMessage})", e)
    }
  }
}
