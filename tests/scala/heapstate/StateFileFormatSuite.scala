package heapstate

import java.io.{ByteArrayInputStream, ByteArrayOutputStream}

import org.apache.hadoop.fs.Path
import org.scalatest.funsuite.AnyFunSuite

import heapstate.io._

class StateFileFormatSuite extends AnyFunSuite {
  private val path = new Path("/tmp/x/7.hs-journal")

  private def write(codec: Codec, records: Seq[(Array[Byte], Option[Array[Byte]])], version: Long = 7): Array[Byte] = {
    val out = new ByteArrayOutputStream()
    val w = new StateFileWriter(out, StateFileFormat.Header(StateFileFormat.KindJournal, codec, version, 3))
    records.foreach { case (k, v) => v.fold(w.delete(k))(w.put(k, _)) }
    val size = w.finish(keyDelta = 0)
    assert(size == out.size())
    out.toByteArray
  }

  private def read(bytes: Array[Byte], version: Long = 7): Seq[(Seq[Byte], Option[Seq[Byte]])] = {
    val got = Seq.newBuilder[(Seq[Byte], Option[Seq[Byte]])]
    StateFileReader.read(new ByteArrayInputStream(bytes), bytes.length, path, version,
      StateFileFormat.KindJournal, (k, v) => got += ((k.toSeq, Some(v.toSeq))), k => got += ((k.toSeq, None)))
    got.result()
  }

  private val records: Seq[(Array[Byte], Option[Array[Byte]])] = (0 until 500).map { i =>
    val key = s"key-$i".getBytes("UTF-8")
    (key, if (i % 7 == 0) None else Some(Array.fill(i % 50)(i.toByte)))
  }
  private val expected = records.map { case (k, v) => (k.toSeq, v.map(_.toSeq)) }

  /** Reads through `readEntries`, splitting each entry back into key and value. */
  private def readAsEntries(bytes: Array[Byte]): Seq[(Seq[Byte], Option[Seq[Byte]])] = {
    val got = Seq.newBuilder[(Seq[Byte], Option[Seq[Byte]])]
    StateFileReader.readEntries(
      new ByteArrayInputStream(bytes),
      bytes.length,
      path,
      7,
      StateFileFormat.KindJournal,
      e => got += ((engine.Entry.key(e).toSeq, Some(engine.Entry.value(e).toSeq))),
      k => got += ((k.toSeq, None))
    )
    got.result()
  }

  for (codec <- Codec.all) {
    test(s"round trip with ${codec.name}") {
      assert(read(write(codec, records)) == expected)
      assert(readAsEntries(write(codec, records)) == expected)
    }
  }

  test("entries written with putEntry read back as the same records") {
    val out = new ByteArrayOutputStream()
    val w = new StateFileWriter(out, StateFileFormat.Header(StateFileFormat.KindJournal, Codec.Lz4, 7, 3))
    records.foreach { case (k, v) => v.fold(w.delete(k))(value => w.putEntry(engine.Entry(k, value))) }
    w.finish(keyDelta = 0)
    assert(read(out.toByteArray) == expected)
  }

  test("an empty journal round-trips") {
    assert(read(write(Codec.Zstd, Nil)).isEmpty)
  }

  test("header carries magic, format version, kind, codec, version and partition") {
    val bytes = write(Codec.Lz4, records)
    assert(new String(bytes.take(4), "US-ASCII") == "HSTF")
    val h = StateFileFormat.decodeHeader(bytes.take(StateFileFormat.HeaderBytes), path, 7)
    assert(h == StateFileFormat.Header(StateFileFormat.KindJournal, Codec.Lz4, 7, 3))
    assert(new String(bytes.takeRight(4), "US-ASCII") == "HSTE")
  }

  private def assertRejected(bytes: Array[Byte], reason: String, version: Long = 7): Unit = {
    val e = intercept[StateFileException](read(bytes, version))
    assert(e.getMessage.contains(path.toString), e.getMessage)
    assert(e.getMessage.contains(s"version $version"), e.getMessage)
    assert(e.getMessage.contains(reason), e.getMessage)
  }

  for (codec <- Codec.all) {
    test(s"every truncation is detected (${codec.name})") {
      val bytes = write(codec, records)
      for (len <- (0 until bytes.length by math.max(1, bytes.length / 97)) :+ (bytes.length - 1)) {
        intercept[StateFileException](read(bytes.take(len)))
      }
    }

    test(s"every single bit flip is detected (${codec.name})") {
      val bytes = write(codec, records.take(40))
      for (pos <- bytes.indices; bit <- Seq(0, 5)) {
        val damaged = bytes.clone()
        damaged(pos) = (damaged(pos) ^ (1 << bit)).toByte
        val e = intercept[StateFileException](read(damaged))
        assert(e.getMessage.contains(path.toString))
      }
    }
  }

  test("specific damage is named") {
    val bytes = write(Codec.Zstd, records)
    assertRejected(bytes.take(10), "truncated")
    val badMagic = bytes.clone(); badMagic(0) = 'X'.toByte
    assertRejected(badMagic, "magic number")
    val badBody = bytes.clone();
    badBody(StateFileFormat.HeaderBytes + 5) = (badBody(StateFileFormat.HeaderBytes + 5) ^ 0xff).toByte
    intercept[StateFileException](read(badBody))
    assertRejected(write(Codec.Zstd, records, version = 8), "name says version 7")
  }

  private val snapshotPath = new Path("/tmp/x/7.hs-snapshot")

  /** A format-2 snapshot of `entries` (key, value), in buckets of `bucketBytes`. */
  private def writeSnapshot(
      codec: Codec, entries: Seq[(Array[Byte], Array[Byte])], bucketBytes: Int = 64): Array[Byte] = {
    val out = new ByteArrayOutputStream()
    val w = new SnapshotFileWriter(out, StateFileFormat.Header(StateFileFormat.KindSnapshot, codec, 7, 3), bucketBytes,
      _ => ())
    entries.foreach { case (k, v) => w.put(k, v) }
    assert(w.finish() == out.size())
    out.toByteArray
  }

  private def readSnapshot(bytes: Array[Byte]): (Map[Seq[Byte], Seq[Byte]], FileSummary) = {
    val got = Map.newBuilder[Seq[Byte], Seq[Byte]]
    var count = 0
    val summary = StateFileReader.read(
      new ByteArrayInputStream(bytes),
      bytes.length,
      snapshotPath,
      7,
      StateFileFormat.KindSnapshot,
      (k, v) => { got += k.toSeq -> v.toSeq; count += 1 },
      _ => fail("a delete in a snapshot")
    )
    assert(count == summary.records)
    (got.result(), summary)
  }

  private val snapshotEntries: Seq[(Array[Byte], Array[Byte])] =
    (0 until 500).map(i => (s"key-$i".getBytes("UTF-8"), Array.fill(i % 50)(i.toByte)))

  for (codec <- Codec.all) {
    test(s"a bucketed snapshot round-trips, each key once (${codec.name})") {
      // Key 7 is given three times, as a snapshot view may repeat a key (with its one value).
      val repeated = snapshotEntries :+ snapshotEntries(7) :+ snapshotEntries(7)
      val bytes = writeSnapshot(codec, repeated)
      val (got, summary) = readSnapshot(bytes)
      assert(got == snapshotEntries.map { case (k, v) => k.toSeq -> v.toSeq }.toMap)
      assert(summary.records == 500 && summary.keyDelta.isEmpty && summary.header.format == 2)
      // Bucket by bucket: every key in the bucket its hash names, every key once.
      val buckets = StateFileReader.openSnapshot(new ByteArrayInputStream(bytes), bytes.length, snapshotPath, 7).get
      try {
        assert(buckets.keyCount == 500 && buckets.buckets >= 64)
        val seen = Seq.newBuilder[Seq[Byte]]
        for (b <- 0 until buckets.buckets) buckets.read(b) { (entry, hash) =>
          assert(buckets.bucketOf(hash) == b)
          seen += engine.Entry.key(entry).toSeq
        }
        assert(seen.result().sortBy(_.toString) == snapshotEntries.map(_._1.toSeq).sortBy(_.toString))
      } finally buckets.close()
    }

    test(s"every truncation and every single bit flip of a bucketed snapshot is detected (${codec.name})") {
      val bytes = writeSnapshot(codec, snapshotEntries.take(60))
      for (len <- 0 until bytes.length) {
        intercept[StateFileException](readSnapshot(bytes.take(len)))
      }
      for (pos <- bytes.indices; bit <- Seq(0, 5)) {
        val damaged = bytes.clone()
        damaged(pos) = (damaged(pos) ^ (1 << bit)).toByte
        val e = intercept[StateFileException](readSnapshot(damaged))
        assert(e.getMessage.contains(snapshotPath.toString))
        intercept[StateFileException](StateFileReader.openSnapshot(new ByteArrayInputStream(damaged), damaged.length,
            snapshotPath, 7))
      }
    }
  }

  /** A snapshot of `entries` in buckets of `bucketBytes`, compressed with zstd and a dictionary trained on them. */
  private def writeWithDictionary(
      entries: Seq[(Array[Byte], Array[Byte])], bucketBytes: Int, dictionaryBytes: Int, codec: Codec = Codec.Zstd)
      : (Array[Byte], SnapshotFileWriter) = {
    val out = new ByteArrayOutputStream()
    val w = new SnapshotFileWriter(out, StateFileFormat.Header(StateFileFormat.KindSnapshot, codec, 7, 3), bucketBytes,
      _ => (), dictionaryBytes = dictionaryBytes)
    entries.foreach { case (k, v) => w.put(k, v) }
    assert(w.finish() == out.size())
    (out.toByteArray, w)
  }

  /** Records shaped like a W1 store's: a numbered key, and a value of a number and hex characters. */
  private val hexEntries: Seq[(Array[Byte], Array[Byte])] = {
    val rng = new scala.util.Random(31)
    (0 until 20000).map { i =>
      (s"key-$i".getBytes("UTF-8"),
        (s"${rng.nextInt(1000)}:" + Seq.fill(40)("0123456789abcdef" (rng.nextInt(16)))
          .mkString).getBytes("UTF-8"))
    }
  }

  test("a zstd snapshot with a dictionary trained on its buckets is format 3, reads back whole, and is smaller") {
    val (bytes, w) = writeWithDictionary(hexEntries, 256, StateFileFormat.DictionaryBytes)
    assert(w.trained && w.dictionary != null && w.dictionary.length <= StateFileFormat.DictionaryBytes)
    val (got, summary) = readSnapshot(bytes)
    assert(summary.header.format == StateFileFormat.DictionaryFormat && summary.records == hexEntries.size)
    assert(got == hexEntries.map { case (k, v) => k.toSeq -> v.toSeq }.toMap)
    val plain = writeSnapshot(Codec.Zstd, hexEntries, bucketBytes = 256)
    assert(bytes.length < plain.length * 9 / 10, s"${bytes.length} bytes with a dictionary, ${plain.length} without")
    val buckets = StateFileReader.openSnapshot(new ByteArrayInputStream(bytes), bytes.length, snapshotPath, 7).get
    val mapped = openMapped(tempFile(bytes), bytes.length)
    try {
      assert(buckets.dictionary.toSeq == w.dictionary.toSeq && mapped.dictionary.toSeq == w.dictionary.toSeq)
      assert(allBuckets(mapped) == allBuckets(buckets))
      assert(valueOf(mapped, "key-12345") == hexEntries(12345)._2.toSeq)
    } finally { buckets.close(); mapped.close() }
  }

  test("a snapshot with too few buckets to train on, or another codec than zstd, is format 2 with no dictionary") {
    for ((entries, codec) <- Seq(hexEntries.take(20) -> Codec.Zstd, hexEntries -> Codec.Lz4)) {
      val (bytes, w) = writeWithDictionary(entries, 256, StateFileFormat.DictionaryBytes, codec)
      assert(w.dictionary == null && !w.trained)
      assert(readSnapshot(bytes)._2.header.format == 2)
      assert(bytes.toSeq == writeSnapshot(codec, entries, bucketBytes = 256).toSeq)
    }
  }

  test("every truncation and every single bit flip of a snapshot with a dictionary is detected") {
    val (bytes, w) = writeWithDictionary(hexEntries.take(400), 64, 256)
    assert(w.dictionary != null)
    for (len <- 0 until bytes.length) intercept[StateFileException](readSnapshot(bytes.take(len)))
    for (pos <- bytes.indices by 3; bit <- Seq(0, 5)) {
      val damaged = bytes.clone()
      damaged(pos) = (damaged(pos) ^ (1 << bit)).toByte
      val e = intercept[StateFileException](readSnapshot(damaged))
      assert(e.getMessage.contains(snapshotPath.toString))
    }
  }

  test("a dictionary's damage and format 3 where it cannot be are named") {
    val (bytes, _) = writeWithDictionary(hexEntries.take(400), 64, 256)
    /** `bytes` with the int at `at` from the body's end set to `v`, and the body's checksum made right again. */
    def withFooterInt(fromBodyEnd: Int, v: Int): Array[Byte] = {
      val b = bytes.clone()
      val bodyEnd = b.length - StateFileFormat.TrailerBytes
      java.nio.ByteBuffer.wrap(b).putInt(bodyEnd - fromBodyEnd, v)
      val crc = new java.util.zip.CRC32C
      crc.update(b, StateFileFormat.HeaderBytes, bodyEnd - StateFileFormat.HeaderBytes)
      java.nio.ByteBuffer.wrap(b).putInt(bodyEnd + 8, crc.getValue.toInt)
      b
    }
    def rejected(b: Array[Byte]): String = intercept[StateFileException](readSnapshot(b)).getMessage
    assert(readSnapshot(withFooterInt(20, java.nio.ByteBuffer.wrap(bytes).getInt(bytes.length - 36)))._1.size == 400)
    assert(rejected(withFooterInt(20, 0)).contains("a dictionary of 0 bytes"))
    assert(rejected(withFooterInt(20, StateFileFormat.MaxDictionaryBytes + 1)).contains("a dictionary of"))
    assert(rejected(withFooterInt(20, 300)).contains("its buckets add up to"))
    def withHeader(b: Array[Byte], h: StateFileFormat.Header): Array[Byte] =
      StateFileFormat.encodeHeader(h) ++ b.drop(StateFileFormat.HeaderBytes)
    val lz4 = withHeader(bytes, StateFileFormat.Header(StateFileFormat.KindSnapshot, Codec.Lz4, 7, 3, format = 3))
    assert(rejected(lz4).contains("format version 3 with codec lz4"))
    val unknown = withHeader(bytes, StateFileFormat.Header(StateFileFormat.KindSnapshot, Codec.Zstd, 7, 3, format = 4))
    assert(rejected(unknown).contains("it has format version 4; this heapstate reads formats 1, 2, 3"))
    val journal = write(Codec.Zstd, records)
    val e = intercept[StateFileException](read(withHeader(journal,
          StateFileFormat.Header(StateFileFormat.KindJournal, Codec.Zstd, 7, 3, format = 3))))
    assert(e.getMessage.contains("journal of format version 3, which only snapshots have"), e.getMessage)
  }

  /** The value `buckets` holds for the key `key` (its UTF-8 bytes), found in its bucket alone. */
  private def valueOf(buckets: SnapshotBuckets, key: String): Seq[Byte] = {
    val bytes = key.getBytes("UTF-8")
    val at = org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET
    val found = buckets.find(buckets.bucketOf(engine.Key.hash(bytes, at, bytes.length)), bytes, at, bytes.length)
    assert(found != null, s"no $key")
    engine.Entry.value(found).toSeq
  }

  /** Every bucket's entries of `buckets`, as (key, value), in bucket order. */
  private def allBuckets(buckets: SnapshotBuckets): Seq[(Seq[Byte], Seq[Byte])] = {
    val got = Seq.newBuilder[(Seq[Byte], Seq[Byte])]
    for (b <- 0 until buckets.buckets) buckets.read(b) { (entry, _) =>
      got += engine.Entry.key(entry).toSeq -> engine.Entry.value(entry).toSeq
    }
    got.result()
  }

  /** `bytes` as the file `name` in a new temporary directory. */
  private def tempFile(bytes: Array[Byte], name: String = "7.hs-snapshot"): java.io.File = {
    val dir = StoreFixture.tempPath("snapshot-map")
    val file = dir.resolve(name)
    java.nio.file.Files.write(file, bytes)
    file.toFile
  }

  /** Opens the snapshot in `file` as a restart does on a local disk: header from a stream, body mapped. */
  private def openMapped(file: java.io.File, length: Long): SnapshotBuckets = {
    val in = new java.io.FileInputStream(file)
    try StateFileReader.openSnapshot(in, length, snapshotPath, 7, Some(file)).get
    finally in.close()
  }

  test("a snapshot opened from a local file is mapped, and its buckets read as the same ones read from a stream") {
    // Large enough for many buckets of 4 KiB, and one read across the mapping's pages.
    val entries = (0 until 20000).map(i => (s"key-$i".getBytes("UTF-8"), Array.fill(i % 300)((i * 7).toByte)))
    val bytes = writeSnapshot(Codec.Zstd, entries, bucketBytes = 4096)
    val fromStream = StateFileReader.openSnapshot(new ByteArrayInputStream(bytes), bytes.length, snapshotPath, 7).get
    val mapped = openMapped(tempFile(bytes), bytes.length)
    try {
      assert(!fromStream.isMapped && mapped.isMapped)
      assert(
        mapped.keyCount == 20000 && mapped.buckets == fromStream.buckets && mapped.heldBytes == fromStream.heldBytes)
      val got = allBuckets(mapped)
      assert(got == allBuckets(fromStream))
      assert(got.toMap == entries.map { case (k, v) => k.toSeq -> v.toSeq }.toMap)
      assert(valueOf(mapped, "key-12345") == entries(12345)._2.toSeq)
    } finally { fromStream.close(); mapped.close() }
  }

  test("every truncation and every single bit flip of a mapped snapshot is detected, naming the file") {
    val bytes = writeSnapshot(Codec.Zstd, snapshotEntries.take(60))
    val file = tempFile(bytes)
    def rejected(content: Array[Byte], listedLength: Long): StateFileException = {
      java.nio.file.Files.write(file.toPath, content)
      intercept[StateFileException] {
        val buckets = openMapped(file, listedLength)
        try allBuckets(buckets)
        finally buckets.close()
      }
    }
    for (len <- 0 until bytes.length) assert(rejected(bytes.take(len), len).getMessage.contains(snapshotPath.toString))
    for (pos <- bytes.indices; bit <- Seq(0, 5)) {
      val damaged = bytes.clone()
      damaged(pos) = (damaged(pos) ^ (1 << bit)).toByte
      assert(rejected(damaged, damaged.length).getMessage.contains(snapshotPath.toString))
    }
    // A file whose size is not the one it was listed with (it changed since) is refused too.
    assert(rejected(bytes, bytes.length - 1L).getMessage.contains("changed while being read"))
  }

  test("a mapped snapshot cut short after it was opened fails on read with an error naming the file and bucket") {
    val entries = (0 until 20000).map(i => (s"key-$i".getBytes("UTF-8"), Array.fill(200)((i * 7).toByte)))
    val bytes = writeSnapshot(Codec.Zstd, entries, bucketBytes = 4096)
    val file = tempFile(bytes)
    val buckets = openMapped(file, bytes.length)
    try {
      val raf = new java.io.RandomAccessFile(file, "rw")
      try raf.getChannel.truncate(StateFileFormat.HeaderBytes.toLong)
      finally raf.close()
      // The last bucket lies pages past the new end: reading its mapping faults, which the JVM
      // reports as an InternalError; the first lies in the one page left, read as zeros.
      val last = buckets.buckets - 1
      val faulted = intercept[StateFileException](buckets.read(last)((_, _) => ()))
      assert(
        faulted.getMessage.contains(snapshotPath.toString) && faulted.getMessage.contains(s"bucket $last: ") &&
          faulted.getMessage.contains("mapped bytes cannot be read"),
        faulted.getMessage
      )
      val zeroed = intercept[StateFileException](buckets.read(0)((_, _) => ()))
      assert(zeroed.getMessage.contains(snapshotPath.toString) && zeroed.getMessage.contains("bucket 0: "),
        zeroed.getMessage)
    } finally buckets.close()
  }

  test("snapshots on the local disk are mapped through StateFiles, unless a checkpoint file manager is named") {
    val entries = snapshotEntries.take(60)
    val bytes = writeSnapshot(Codec.Zstd, entries)
    val file = tempFile(bytes)
    val dir = new Path(file.getParentFile.toURI)
    val listed =
      StateFileNames.StateFile(7, StateFileNames.Snapshot, new Path(dir, file.getName), bytes.length, None, None)
    def open(conf: org.apache.hadoop.conf.Configuration): SnapshotBuckets =
      new StateFiles(dir, conf, 3).openSnapshot(listed).get
    val local = open(new org.apache.hadoop.conf.Configuration())
    val named = new org.apache.hadoop.conf.Configuration()
    named.set(StateFiles.FileManagerClassKey,
      StoreFixture.FileSystemManager)
    val viaManager = open(named)
    try {
      assert(local.isMapped && !viaManager.isMapped)
      assert(allBuckets(local) == allBuckets(viaManager))
      assert(allBuckets(local).toMap == entries.map { case (k, v) => k.toSeq -> v.toSeq }.toMap)
    } finally { local.close(); viaManager.close() }
  }

  test("zstd blocks are the frames zstd-jni's byte-array call writes, and read back either way") {
    // The block codec goes through direct buffers (see DirectBlocks); the frames must stay the
    // ones the byte-array call writes with the same settings, so that files of either kind read.
    val random = new java.util.Random(11)
    val reference = new com.github.luben.zstd.ZstdCompressCtx()
    reference.setLevel(1); reference.setMinMatch(Codec.Zstd.BlockMinMatch)
    val plain = new com.github.luben.zstd.ZstdDecompressCtx()
    val blocks = Codec.Zstd.blocks()
    try {
      // Growing sizes, so that the direct buffers are outgrown and replaced along the way.
      for (len <- Seq(1, 100, 8192, 70000, 300000, 5000)) {
        val src = Array.tabulate[Byte](len)(i => if (i % 3 == 0) random.nextInt(16).toByte else (i % 7).toByte)
        val room = blocks.maxCompressedLength(len)
        val viaDirect = new Array[Byte](room + 3)
        val n = blocks.compress(src, len, viaDirect)
        val viaArrays = new Array[Byte](room)
        val m = reference.compressByteArray(viaArrays, 0, room, src, 0, len)
        assert(viaDirect.take(n).toSeq == viaArrays.take(m).toSeq, s"$len bytes")
        // Read back through the codec from an offset, and through the byte-array call.
        val shifted = new Array[Byte](n + 5)
        System.arraycopy(viaDirect, 0, shifted, 5, n)
        val back = new Array[Byte](len)
        blocks.decompress(shifted, 5, n, back, len)
        assert(back.toSeq == src.toSeq)
        val back2 = new Array[Byte](len)
        assert(plain.decompressByteArray(back2, 0, len, viaDirect, 0, n) == len && back2.toSeq == src.toSeq)
        // A block that holds more than it is said to is refused.
        if (len > 1) intercept[Exception](blocks.decompress(viaDirect, 0, n, new Array[Byte](len - 1), len - 1))
      }
    } finally { blocks.close(); reference.close(); plain.close() }
  }

  test("a zstd stream longer than many input buffers round-trips, however it is written") {
    val random = new java.util.Random(5)
    val data = Array.tabulate[Byte](DirectZstdOutput.InputBytes * 5 + 77)(i =>
      if (i % 5 == 0) random.nextInt(256).toByte else (i % 11).toByte)
    val sink = new ByteArrayOutputStream()
    val z = Codec.Zstd.compress(sink)
    var at = 0
    var piece = 0
    while (at < data.length) { // single bytes, small pieces and pieces larger than the input buffer
      val n = math.min(data.length - at, Seq(1, 3, 1000, DirectZstdOutput.InputBytes + 5, 70000)(piece % 5))
      if (n == 1) z.write(data(at).toInt) else z.write(data, at, n)
      at += n
      piece += 1
      if (piece == 7) z.flush()
    }
    z.close()
    z.close() // a second close does nothing
    intercept[java.io.IOException](z.write(1))
    val back = Codec.Zstd.decompress(new ByteArrayInputStream(sink.toByteArray)).readAllBytes()
    assert(back.toSeq == data.toSeq)
    assert(sink.size() < data.length / 2)
  }

  test("zstd streams reuse contexts and buffers: every frame reads back, and one that failed is not reused") {
    val random = new java.util.Random(9)
    def data(n: Int) = Array.tabulate[Byte](n)(i => if (i % 3 == 0) random.nextInt(256).toByte else (i % 7).toByte)
    def roundTrip(bytes: Array[Byte]): Unit = {
      val sink = new ByteArrayOutputStream()
      val z = Codec.Zstd.compress(sink)
      z.write(bytes, 0, bytes.length)
      z.close()
      val back = Codec.Zstd.decompress(new ByteArrayInputStream(sink.toByteArray)).readAllBytes()
      assert(back.toSeq == bytes.toSeq, s"a frame of ${bytes.length} bytes")
    }
    // One after another (each reuses the kit the one before gave back), then several open at once.
    Seq(0, 1, 100, DirectZstdOutput.InputBytes + 3, 5000, 0, 70000).foreach(n => roundTrip(data(n)))
    assert(DirectZstdOutput.idleKits >= 1 && DirectZstdOutput.idleKits <= 4)
    val open = (1 to 6).map { i =>
      val sink = new ByteArrayOutputStream()
      val bytes = data(1000 * i)
      val z = Codec.Zstd.compress(sink)
      z.write(bytes, 0, bytes.length)
      (sink, bytes, z)
    }
    open.foreach { case (sink, bytes, z) =>
      z.close()
      assert(Codec.Zstd.decompress(new ByteArrayInputStream(sink.toByteArray)).readAllBytes().toSeq == bytes.toSeq)
    }
    assert(DirectZstdOutput.idleKits == 4, "at most four kits are kept")
    // A stream whose output fails mid-frame: its context is closed, not handed to the next stream.
    val failing = new java.io.OutputStream {
      override def write(b: Int): Unit = throw new java.io.IOException("disk full")
      override def write(b: Array[Byte], off: Int, len: Int): Unit = throw new java.io.IOException("disk full")
    }
    val broken = Codec.Zstd.compress(failing)
    val big = data(DirectZstdOutput.InputBytes * 2)
    intercept[java.io.IOException] {
      try broken.write(big, 0, big.length)
      finally broken.close()
    }
    assert(DirectZstdOutput.idleKits == 3, "the failed stream's kit was taken and not given back")
    (1 to 5).foreach(i => roundTrip(data(777 * i)))
  }

  test("an empty snapshot round-trips, with no buckets to read") {
    val bytes = writeSnapshot(Codec.Zstd, Nil)
    assert(readSnapshot(bytes)._1.isEmpty)
    val buckets = StateFileReader.openSnapshot(new ByteArrayInputStream(bytes), bytes.length, snapshotPath, 7).get
    assert(buckets.keyCount == 0 && buckets.buckets == 1)
    buckets.close()
  }

  test("a journal carries its key delta") {
    val out = new ByteArrayOutputStream()
    val w = new StateFileWriter(out, StateFileFormat.Header(StateFileFormat.KindJournal, Codec.Zstd, 7, 3))
    w.put("a".getBytes("UTF-8"), Array[Byte](1))
    w.delete("b".getBytes("UTF-8"))
    w.finish(keyDelta = -41)
    val bytes = out.toByteArray
    val summary = StateFileReader.read(new ByteArrayInputStream(bytes), bytes.length, path, 7,
      StateFileFormat.KindJournal, (_, _) => (), _ => ())
    assert(summary.keyDelta.contains(-41L) && summary.records == 2)
  }

  test("files of format 1 are read: journals without a key delta, snapshots as one stream") {
    def resource(name: String): Array[Byte] = {
      val in = getClass.getResourceAsStream(s"/format1/$name")
      try in.readAllBytes()
      finally in.close()
    }
    val journal = resource("5.hs-journal")
    val j = StateFileReader.read(new ByteArrayInputStream(journal), journal.length, new Path("/x/5.hs-journal"), 5,
      StateFileFormat.KindJournal, (_, _) => (), _ => ())
    assert(j.header.format == 1 && j.keyDelta.isEmpty && j.records > 0)
    val snapshot = resource("3.hs-snapshot")
    var keys = 0
    val s = StateFileReader.read(
      new ByteArrayInputStream(snapshot),
      snapshot.length,
      new Path("/x/3.hs-snapshot"),
      3,
      StateFileFormat.KindSnapshot,
      (_, _) => keys += 1,
      _ => fail("a delete in a snapshot")
    )
    assert(s.header.format == 1 && keys == s.records && keys > 0)
    assert(StateFileReader.openSnapshot(new ByteArrayInputStream(snapshot), snapshot.length,
        new Path("/x/3.hs-snapshot"), 3).isEmpty)
  }

  test("file names parse and reject strangers") {
    import StateFileNames.{Journal, Name, Snapshot}
    val (a, b) = ("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "11111111-2222-3333-4444-555555555555")
    assert(StateFileNames.parse("12.hs-journal").contains(Name(12L, Journal, None, None)))
    assert(StateFileNames.parse("10.hs-snapshot").contains(Name(10L, Snapshot, None, None)))
    assert(StateFileNames.parse(s"12_${a}_$b.hs-journal").contains(Name(12L, Journal, Some(a), Some(b))))
    assert(StateFileNames.parse(s"1_$a.hs-journal").contains(Name(1L, Journal, Some(a), None)))
    assert(StateFileNames.parse(s"10_$a.hs-snapshot").contains(Name(10L, Snapshot, Some(a), None)))
    val dir = new org.apache.hadoop.fs.Path("/x")
    for (n <-
        Seq(Name(12L, Journal, Some(a), Some(b)), Name(1L, Journal, Some(a), None), Name(3L, Journal, None, None))) {
      assert(StateFileNames.parse(StateFileNames.journal(dir, n.version, n.id, n.base).getName).contains(n))
    }
    Seq(
      "12.delta",
      "10.snapshot",
      ".12.hs-journal.tmp",
      "x.hs-journal",
      ".hs-journal",
      "-1.hs-journal",
      s"10_${a}_$b.hs-snapshot",
      s"12_${a}_${b}_$a.hs-journal",
      "12_.hs-journal",
      "12__x.hs-journal",
      "12_a b.hs-journal",
      "12_x.y.hs-journal"
    )
      .foreach(n => assert(StateFileNames.parse(n).isEmpty, n))
  }

  test("a journal whose records fail, with an error or an exception, leaves no file and no temporary file") {
    val dir = StoreFixture.tempPath("heapstate-journal-fail").toFile
    val files = new StateFiles(new Path(dir.getPath), new org.apache.hadoop.conf.Configuration(), 0)
    // A fatal error (not NonFatal), as an OutOfMemoryError in the commit's look-ups would be.
    for (failure <- Seq[Throwable](new StackOverflowError("in the look-ups"), new java.io.IOException("disk"))) {
      val thrown = intercept[Throwable](files.writeJournal(1, Codec.Zstd, None, None) { w =>
        w.put(Array[Byte](1, 2), Array[Byte](3))
        throw failure
      })
      assert(thrown eq failure)
      assert(Option(dir.list()).toSeq.flatten.isEmpty, dir.list().toSeq)
    }
    files.writeJournal(1, Codec.Zstd, None, None) { w => w.put(Array[Byte](1, 2), Array[Byte](3)); 1L }
    assert(dir.list().toSeq == Seq("1.hs-journal"))
  }
}
