package heapstate.io

import java.io.{DataInputStream, EOFException, InputStream}
import java.nio.ByteBuffer
import java.util.zip.CRC32C

import scala.util.control.NonFatal

import org.apache.hadoop.fs.Path

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
