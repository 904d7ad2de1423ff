package heapstate.io

import java.io.{BufferedOutputStream, DataOutputStream, OutputStream}

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
