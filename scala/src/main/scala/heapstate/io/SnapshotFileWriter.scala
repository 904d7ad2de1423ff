package heapstate.io

import java.io.{BufferedOutputStream, OutputStream}
import java.nio.ByteBuffer

import scala.util.control.NonFatal

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
