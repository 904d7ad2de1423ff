package heapstate

import java.io.{ByteArrayInputStream, ByteArrayOutputStream}

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.scalatest.funsuite.AnyFunSuite

import heapstate.engine._
import heapstate.io._

/**
 * A snapshot that copies the buckets no commit changed from the snapshot before it must be the
 * file a fresh write of the same state makes, byte for byte, and hold the state of its version.
 */
class SnapshotReuseSuite extends AnyFunSuite {
  private val path = new Path("/tmp/x/7.hs-snapshot")
  private def header(codec: Codec) = StateFileFormat.Header(StateFileFormat.KindSnapshot, codec, 7, 3)

  private def write(codec: Codec, entries: Map[Long, Array[Byte]], bucketBytes: Int, reuse: BucketReuse = null,
      dictionaryBytes: Int = 0, dictionary: Array[Byte] = null): (Array[Byte], SnapshotFileWriter) = {
    val out = new ByteArrayOutputStream()
    val w = new SnapshotFileWriter(out, header(codec), bucketBytes, _ => (), reuse, 0, dictionaryBytes, dictionary)
    entries.foreach { case (k, v) => w.put(java.nio.ByteBuffer.allocate(8).putLong(k).array(), v) }
    assert(w.finish() == out.size())
    (out.toByteArray, w)
  }

  private def open(bytes: Array[Byte]): SnapshotBuckets =
    StateFileReader.openSnapshot(new ByteArrayInputStream(bytes), bytes.length, path, 7).get

  /** Opens the snapshot `file` holds (`length` bytes) mapped, as a store on the local disk does. */
  private def openMapped(file: java.io.File, length: Int): SnapshotBuckets = {
    val in = new java.io.FileInputStream(file)
    try StateFileReader.openSnapshot(in, length, path, 7, Some(file)).get
    finally in.close()
  }

  private def keyOf(k: Long): Array[Byte] = java.nio.ByteBuffer.allocate(8).putLong(k).array()
  private def hashOf(k: Long): Int = Key(keyOf(k)).hashCode

  for (codec <- Codec.all) {
    test(s"a snapshot that copies unchanged buckets is the file a fresh write makes (${codec.name})") {
      val rng = new scala.util.Random(11)
      def payload() = Array.fill(20 + rng.nextInt(40))(rng.nextInt(16).toByte)
      val before = (0L until 5000L).map(k => k -> payload()).toMap
      // Updates (some of the same length), removals and new keys: each marks its key's bucket.
      val touched = new TouchedBuckets(StateFileFormat.MaxBucketBits)
      var after = before
      for (k <- 0L until 5000L by 97L) { after += k -> payload(); touched.mark(hashOf(k)) }
      for (k <- 13L until 5000L by 331L) { after -= k; touched.mark(hashOf(k)) }
      for (k <- 9000L until 9020L) { after += k -> payload(); touched.mark(hashOf(k)) }
      val (first, _) = write(codec, before, bucketBytes = 256)
      val (fresh, freshWriter) = write(codec, after, bucketBytes = 256)
      val base = open(first)
      try {
        assert(base.bucketBits == open(fresh).bucketBits, "the two states must split into as many buckets")
        val (copied, writer) = write(codec, after, bucketBytes = 256, new BucketReuse(base, touched.untouched))
        assert(freshWriter.reused == 0)
        assert(writer.reused > writer.bucketCount / 2 && writer.reused < writer.bucketCount,
          s"${writer.reused} of ${writer.bucketCount} buckets copied")
        assert(copied.toSeq == fresh.toSeq)
      } finally base.close()
    }
  }

  test("a snapshot copies buckets from a base with a dictionary, with that dictionary, and makes the fresh file") {
    val rng = new scala.util.Random(23)
    def payload() = Array.fill(20 + rng.nextInt(40))(('a' + rng.nextInt(16)).toByte)
    val before = (0L until 20000L).map(k => k -> payload()).toMap
    val touched = new TouchedBuckets(StateFileFormat.MaxBucketBits)
    var after = before
    for (k <- 0L until 20000L by 211L) { after += k -> payload(); touched.mark(hashOf(k)) }
    val (first, firstWriter) = write(Codec.Zstd, before, 256, dictionaryBytes = 4096)
    assert(firstWriter.trained && firstWriter.dictionary != null && firstWriter.dictionary.length <= 4096)
    val base = open(first)
    try {
      assert(base.dictionary.toSeq == firstWriter.dictionary.toSeq)
      val (copied, writer) = write(Codec.Zstd, after, 256, new BucketReuse(base, touched.untouched), 4096)
      assert(!writer.trained && writer.dictionary.toSeq == base.dictionary.toSeq, "the base's dictionary was not kept")
      assert(writer.reused > writer.bucketCount / 2 && writer.reused < writer.bucketCount,
        s"${writer.reused} of ${writer.bucketCount} buckets copied")
      // A fresh write given the same dictionary makes the same file; one that trains its own, not.
      assert(copied.toSeq == write(Codec.Zstd, after, 256, dictionary = base.dictionary)._1.toSeq)
      val (retrained, w) = write(Codec.Zstd, after, 256, dictionaryBytes = 4096)
      assert(w.trained && w.reused == 0 && retrained.toSeq != copied.toSeq)
      val reread = open(copied)
      try assert(reread.keyCount == after.size && reread.dictionary.toSeq == base.dictionary.toSeq)
      finally reread.close()
    } finally base.close()
    // A base without a dictionary: the writer trains one and copies nothing, since no bucket of
    // the base was compressed with it.
    val plain = open(write(Codec.Zstd, before, 256)._1)
    try {
      assert(plain.dictionary == null)
      val (_, w) = write(Codec.Zstd, after, 256, new BucketReuse(plain, touched.untouched), 4096)
      assert(w.trained && w.reused == 0)
    } finally plain.close()
  }

  test("given the changed buckets' entries alone, a snapshot copies the others and makes the fresh file") {
    val rng = new scala.util.Random(29)
    def payload() = Array.fill(20 + rng.nextInt(40))(('a' + rng.nextInt(16)).toByte)
    val before = (0L until 20000L).map(k => k -> payload()).toMap
    val touched = new TouchedBuckets(StateFileFormat.MaxBucketBits)
    var after = before
    for (k <- 0L until 20000L by 173L) { after += k -> payload(); touched.mark(hashOf(k)) }
    for (k <- 5L until 20000L by 1009L) { after -= k; touched.mark(hashOf(k)) }
    for (k <- 30000L until 30010L) { after += k -> payload(); touched.mark(hashOf(k)) }
    def changedOnly(codec: Codec, base: SnapshotBuckets, state: Map[Long, Array[Byte]], dictionaryBytes: Int,
        also: Long => Boolean = _ => false): (Array[Byte], SnapshotFileWriter) = {
      val changed = touched.touchedAt(base.bucketBits)
      write(
        codec,
        state.filter { case (k, _) => changed.containsHash(hashOf(k)) || also(k) },
        256,
        new BucketReuse(base, touched.untouched, onlyChanged = true, keyCount = state.size),
        dictionaryBytes
      )
    }
    for ((codec, dictionaryBytes) <- Seq(Codec.Zstd -> 4096, Codec.Zstd -> 0, Codec.Lz4 -> 0)) {
      val base = open(write(codec, before, 256, dictionaryBytes = dictionaryBytes)._1)
      try {
        val changed = touched.touchedAt(base.bucketBits)
        assert(changed.size > 0 && changed.size < base.buckets / 2, s"${changed.size} of ${base.buckets} changed")
        val (copied, w) = changedOnly(codec, base, after, dictionaryBytes)
        assert(w.reused == base.buckets - changed.size && w.bucketCount == base.buckets)
        assert(!w.trained && java.util.Arrays.equals(w.dictionary, base.dictionary))
        val fresh = write(codec, after, 256, dictionary = base.dictionary)._1
        assert(copied.toSeq == fresh.toSeq, s"${codec.name}, dictionary of $dictionaryBytes bytes")
        val reread = open(copied)
        try assert(reread.keyCount == after.size)
        finally reread.close()
      } finally base.close()
    }
    val base = open(write(Codec.Zstd, before, 256, dictionaryBytes = 4096)._1)
    try {
      // An entry of a bucket named unchanged: a caller's mistake, never a file missing it or holding it twice.
      val stray = before.keys.find(k => !touched.touchedAt(base.bucketBits).containsHash(hashOf(k))).get
      val e = intercept[IllegalStateException](changedOnly(Codec.Zstd, base, after, 4096, _ == stray))
      assert(e.getMessage.contains(s"bucket ${base.bucketOf(hashOf(stray))}, which is unchanged since snapshot 7"))
      // A key removed from a bucket named unchanged, or added to one, and not counted as a change:
      // the base's copy of that bucket makes the records one more or one fewer than the state's keys.
      val missed = after - stray
      val removed = intercept[BucketReuse.ChangedOnlyRefused](changedOnly(Codec.Zstd, base, missed, 4096))
      assert(removed.miscounted && removed.getMessage.contains(s"the snapshot of version 7 of partition 3 holds " +
        s"${after.size} records, copied from snapshot 7 and put, where the state holds ${missed.size} keys"))
      val unseen =
        Iterator.from(100000).map(_.toLong).find(k => !touched.touchedAt(base.bucketBits).containsHash(hashOf(k))).get
      val added =
        intercept[BucketReuse.ChangedOnlyRefused](changedOnly(Codec.Zstd, base, after + (unseen -> payload()), 4096))
      assert(added.miscounted && added.getMessage.contains(s"holds ${after.size} records, copied from snapshot 7 and " +
        s"put, where the state holds ${after.size + 1} keys: the caller's account of the changes is wrong"))
      // Another codec, or no dictionary where the base has one.
      Seq(Codec.Lz4 -> 0, Codec.Zstd -> 0).foreach { case (codec, bytes) =>
        val other = intercept[BucketReuse.ChangedOnlyRefused](changedOnly(codec, base, after, bytes))
        assert(other.getMessage.contains("snapshot 7, which the snapshot of version 7 would copy from, has another " +
          "codec or dictionary (zstd, ") && !other.miscounted)
      }
      // Twice the records: the state calls for one more bucket bit than the base has.
      val grown = after ++ (40000L until 60000L).map(k => k -> payload())
      (40000L until 60000L).foreach(k => touched.mark(hashOf(k)))
      val refused = intercept[BucketReuse.ChangedOnlyRefused](changedOnly(Codec.Zstd, base, grown, 4096))
      assert(refused.getMessage.contains(s"for ${2 * base.buckets} buckets, and snapshot 7, which it would copy " +
        s"from, has ${base.buckets}") && !refused.miscounted)
    } finally base.close()
    // A base without a dictionary, where the snapshot wants one.
    val plain = open(write(Codec.Zstd, before, 256)._1)
    try {
      val refused = intercept[BucketReuse.ChangedOnlyRefused](changedOnly(Codec.Zstd, plain, after, 4096))
      assert(refused.getMessage.contains("has another codec or dictionary (zstd, none)"))
    } finally plain.close()
  }

  test(
    "a writer told how many entries to expect makes the same file whether the count is right, short, long or absent") {
    val rng = new scala.util.Random(17)
    val entries = (0L until 12000L).map(k => k -> Array.fill(10 + rng.nextInt(30))(rng.nextInt(16).toByte))
    def writeExpecting(expected: Int): (Seq[Byte], Int) = {
      val out = new ByteArrayOutputStream()
      val w = new SnapshotFileWriter(out, header(Codec.Zstd), 512, _ => (), null, expected)
      entries.foreach { case (k, v) => w.put(keyOf(k), v) }
      assert(w.finish() == out.size())
      (out.toByteArray.toSeq, w.growths)
    }
    val (none, doublings) = writeExpecting(0)
    assert(doublings == 4) // 1,024 to 16,384
    assert(writeExpecting(12000) == ((none, 0)))
    assert(writeExpecting(20000) == ((none, 0)))
    // An eighth more at a time: 9,000, 10,125, 11,390, 12,813.
    assert(writeExpecting(9000) == ((none, 3)))
    // At least 1,024 more at a time: 3,000, then six steps of 1,024 to 9,144, then an eighth:
    // 10,287, 11,572, 13,018.
    assert(writeExpecting(3000) == ((none, 9)))
    intercept[IllegalArgumentException](writeExpecting(-1))
  }

  test("buckets are compressed afresh when the earlier snapshot has another split, another codec, or entries added") {
    val before = (0L until 3000L).map(k => k -> Array.fill(30)(k.toByte)).toMap
    val nothing = new TouchedBuckets(10)
    val (first, _) = write(Codec.Zstd, before, bucketBytes = 512)
    val base = open(first)
    try {
      // Twice the records: one more bucket bit.
      val grown = before ++ (10000L until 13000L).map(k => k -> Array.fill(30)(k.toByte))
      assert(write(Codec.Zstd, grown, 512, new BucketReuse(base, nothing.untouched))._2.reused == 0)
      assert(write(Codec.Lz4, before, 512, new BucketReuse(base, nothing.untouched))._2.reused == 0)
      // A caller that missed the keys it added: their buckets' counts differ, so they are filled anew.
      val added = before ++ Seq(20000L -> Array.fill(30)(1.toByte))
      val (bytes, w) = write(Codec.Zstd, added, 512, new BucketReuse(base, nothing.untouched))
      assert(w.reused == w.bucketCount - 1)
      assert(bytes.toSeq == write(Codec.Zstd, added, 512)._1.toSeq)
    } finally base.close()
  }

  test("a base file changed or cut short after it was opened fails the copy, never the new file's contents") {
    val rng = new scala.util.Random(3)
    val before = (0L until 20000L).map(k => k -> Array.fill(200)(rng.nextInt(16).toByte)).toMap
    val (first, _) = write(Codec.Zstd, before, bucketBytes = 4096)
    val nothing = new TouchedBuckets(StateFileFormat.MaxBucketBits) // every bucket is copied
    def copyAfter(spoil: java.io.RandomAccessFile => Unit): BucketReuse.CopyFailed = {
      val dir = StoreFixture.tempPath("reuse-spoilt")
      val file = dir.resolve("7.hs-snapshot").toFile
      java.nio.file.Files.write(file.toPath, first)
      val base = openMapped(file, first.length)
      try {
        assert(base.isMapped)
        val raf = new java.io.RandomAccessFile(file, "rw")
        try spoil(raf)
        finally raf.close()
        intercept[BucketReuse.CopyFailed](write(Codec.Zstd, before, 4096, new BucketReuse(base, nothing.untouched)))
      } finally base.close()
    }
    // A byte changed in place: the mapping shows it and the copy reads it without a fault; the
    // check of the whole body after the last bucket finds it.
    val changed = copyAfter { raf =>
      raf.seek(first.length / 2); val b = raf.read(); raf.seek(first.length / 2); raf.write(b ^ 0xff)
    }
    assert(changed.getMessage.contains(path.toString) && changed.getMessage.contains("changed since it was opened"),
      changed.getMessage)
    // Cut short: the pages past the end fault, the one left reads as zeros.
    val cut = copyAfter(_.getChannel.truncate(StateFileFormat.HeaderBytes.toLong))
    assert(cut.getMessage.contains(path.toString), cut.getMessage)
  }

  test("buckets copied from a base over 64 MiB, one of them across two of its chunks, make the fresh file") {
    // The base's body is held in chunks of 64 MiB (arrays from a stream, or mappings of a file), so a
    // bucket may start in one chunk and end in the next. About 75 MB of incompressible entries.
    val rng = new scala.util.Random(5)
    val before = (0L until 300000L).map { k =>
      val v = new Array[Byte](240); rng.nextBytes(v); k -> v
    }.toMap
    val (first, _) = write(Codec.Lz4, before, bucketBytes = 4096)
    val chunk = 1L << 26
    assert(first.length > chunk + 1000000, s"the base must pass its first chunk, not ${first.length} bytes")
    val stream = open(first)
    val (across, bits) =
      try {
        var at = 0L
        val b = (0 until stream.buckets).find { b => at += stream.storedLength(b); at > chunk }.get
        assert(at - stream.storedLength(b) < chunk, "the bucket starts in the first chunk")
        (b, stream.bucketBits)
      } finally stream.close()
    // Every 500th key changed, and a few removed, but none of the bucket across the chunks.
    val touched = new TouchedBuckets(StateFileFormat.MaxBucketBits)
    var after = before
    for (k <- 0L until 300000L by 500L if StateFileFormat.bucketOf(hashOf(k), bits) != across) {
      after += k -> Array.fill(240)(k.toByte); touched.mark(hashOf(k))
    }
    for (k <- 7L until 300000L by 9001L if StateFileFormat.bucketOf(hashOf(k), bits) != across) {
      after -= k; touched.mark(hashOf(k))
    }
    val (fresh, _) = write(Codec.Lz4, after, bucketBytes = 4096)
    val changed = (0 until (1 << bits)).count(b => !touched.untouched(b, bits))
    val file = StoreFixture.tempPath("reuse-chunks").resolve("7.hs-snapshot").toFile
    java.nio.file.Files.write(file.toPath, first)
    for (mapped <- Seq(false, true)) {
      val base = if (mapped) openMapped(file, first.length) else open(first)
      try {
        assert(base.isMapped == mapped && base.bucketBits == bits)
        val (copied, writer) = write(Codec.Lz4, after, bucketBytes = 4096, new BucketReuse(base, touched.untouched))
        assert(
          writer.bucketCount == (1 << bits) && writer.reused == writer.bucketCount - changed,
          s"mapped=$mapped: ${writer.reused} of ${writer.bucketCount} buckets copied, $changed changed"
        )
        val differsAt = java.util.Arrays.mismatch(copied, fresh) // not assert(a == b): it would print 75 MB
        assert(differsAt == -1, s"mapped=$mapped: the file differs from a fresh write from byte $differsAt")
      } finally base.close()
    }
  }

  test("touched buckets answer for every coarser split") {
    val t = new TouchedBuckets(6)
    val hash = 0x9c000000 // bucket 39 of 64 (0b100111): 19 of 32, 9 of 16, 4 of 8, 2 of 4, 1 of 2, 0 of 1
    t.mark(hash)
    for (k <- 0 to 6; b <- 0 until (1 << k)) {
      assert(t.untouched(b, k) == (b != (39 >>> (6 - k))), s"bucket $b of ${1 << k}")
    }
    assert(!t.untouched(0, 7), "a split finer than the account's is never known to be untouched")
    val big = new TouchedBuckets(12)
    big.mark(0x00100000) // bucket 1 of 4096
    assert(!big.untouched(0, 5) && big.untouched(1, 5) && !big.untouched(0, 0))
    val copy = big.copy()
    big.markAll()
    assert(!big.untouched(1, 5) && copy.untouched(1, 5))
  }

  /** Asserts that snapshot `f` holds exactly `model`, naming a few of the keys that differ. */
  private def assertHolds(files: StateFiles, f: StateFileNames.StateFile, model: Map[Long, Long]): Unit = {
    val got = contents(files, f)
    val wrong = (got.keySet ++ model.keySet).filter(k => got.get(k) != model.get(k))
    assert(
      wrong.isEmpty,
      s"snapshot of version ${f.version}: ${wrong.size} keys differ from the model, " +
        wrong.take(5).map(k => s"$k: ${got.get(k)} against ${model.get(k)}").mkString("; ")
    )
  }

  /** Each key of the snapshot file `f` with its value. */
  /** The snapshot file of version `v` in `files`. */
  private def snapshotIn(files: StateFiles, v: Long): StateFileNames.StateFile =
    files.list().find(f => f.kind == StateFileNames.Snapshot && f.version == v).get

  /**
   * The dictionary snapshot `v` of `files` was compressed with, which a fresh write of the same
   * state must use to make the same file (a dictionary trained anew on the state of `v` differs
   * from the one its engine keeps from snapshot to snapshot). Every engine snapshot of these tests
   * is big enough to train one on.
   */
  private def dictionaryOf(files: StateFiles, v: Long): Array[Byte] = {
    val opened = files.openSnapshot(snapshotIn(files, v)).get
    try {
      assert(opened.dictionary != null, s"snapshot $v has no dictionary")
      opened.dictionary
    } finally opened.close()
  }

  private def contents(files: StateFiles, f: StateFileNames.StateFile): Map[Long, Long] = {
    val got = mutable.Map.empty[Long, Long]
    files.read(f)((k, v) => got(java.nio.ByteBuffer.wrap(k).getLong) = java.nio.ByteBuffer.wrap(v).getLong,
      _ => fail("a delete in a snapshot"))
    got.toMap
  }

  test("an engine's snapshots copy what no commit changed since its last one, and hold their versions") {
    val dir = new Path(StoreFixture.tempDir(), "store")
    val files = new StateFiles(dir, new Configuration(), 0)
    val settings = EngineSettings(4, Codec.Zstd, 2, 1000, snapshotBucketBytes = 256)
    val engine = new StateEngine(files, settings, None)
    def value(v: Long) = java.nio.ByteBuffer.allocate(8).putLong(v).array()
    val rng = new scala.util.Random(5)
    var model = Map.empty[Long, Long]
    val models = mutable.Map[Long, Map[Long, Long]]()
    def commit(v: Long)(changes: ChangeSet => Unit): Unit = {
      engine.ensureAt(v)
      val cs = new ChangeSet(engine.live)
      changes(cs)
      engine.commit(v, cs)
      models(v + 1) = model
    }
    def put(cs: ChangeSet, k: Long, x: Long): Unit = {
      val key = Key(keyOf(k)); cs.put(key, Entry(key.bytes, value(x))); model += k -> x
    }
    def remove(cs: ChangeSet, k: Long): Unit = { cs.remove(Key(keyOf(k))); model -= k }
    engine.ensureAt(0)
    commit(0)(cs => (0L until 20000L).foreach(k => put(cs, k, k)))
    val reusedBefore = mutable.ArrayBuffer.empty[Long]
    def snapshot(): Long = {
      val was = engine.snapshotBucketsReused
      val v = engine.snapshotIfDue(force = true).get
      reusedBefore += engine.snapshotBucketsReused - was
      v
    }
    assert(snapshot() == 1)
    // Same-length updates (written in place: no snapshot is being written), removals, new keys.
    for (v <- 1L until 9L) commit(v) { cs =>
      for (_ <- 0 until 40) put(cs, rng.nextInt(20000).toLong, rng.nextLong())
      for (_ <- 0 until 5) remove(cs, rng.nextInt(20000).toLong)
      put(cs, 100000L + v, v)
    }
    assert(engine.live.writtenInPlace > 0)
    assert(snapshot() == 9)
    assert(reusedBefore.toList.head == 0, "the first snapshot has nothing to copy from")
    assert(reusedBefore(1) > 0, "the second snapshot copied nothing")
    assert(engine.snapshotsFromChangedBuckets == 1, "the second snapshot viewed every key")
    // The same state written afresh, to another directory: the same file.
    val fresh = new StateFiles(new Path(StoreFixture.tempDir(), "fresh"), new Configuration(), 0)
    fresh.writeSnapshot(9, Codec.Zstd, 256, dictionary = dictionaryOf(files, 9))(w =>
      engine.live.writeSnapshotView(9, w.putEntry(_, _, _)))
    def bytesOf(fs: StateFiles) =
      java.nio.file.Files.readAllBytes(new java.io.File(fs.snapshotPath(9).toUri.getPath).toPath).toSeq
    assert(bytesOf(files) == bytesOf(fresh))
    // A roll-back forgets the base: the next snapshot compresses every bucket.
    commit(9)(cs => put(cs, 5L, 55L))
    commit(10)(cs => put(cs, 6L, 66L))
    model = models(10)
    engine.ensureAt(10) // one step back, through the undo log
    commit(10)(cs => put(cs, 7L, 77L))
    assert(snapshot() == 11)
    assert(reusedBefore.last == 0, "a snapshot after a roll-back copied buckets")
    // A later one copies from that one again.
    commit(11)(cs => put(cs, 8L, 88L))
    assert(snapshot() == 12)
    assert(reusedBefore.last > 0)
    assert(engine.snapshotsFromChangedBuckets == 2 && engine.snapshotsRefusedChangedOnly == ((0L, 0L)))
    // A key put into the table behind the engine's back, in a bucket no commit since snapshot 12
    // touched (the one commit touched key 9's): the buckets copied and those viewed hold one record
    // fewer than the state has keys, so the writer refuses, and a view of every key writes the
    // snapshot, stray key included, copying no bucket on the word of the wrong account.
    commit(12)(cs => put(cs, 9L, 99L))
    val twelve =
      files.openSnapshot(snapshotIn(files, 12L)).get
    val stray =
      try Iterator.from(300000).map(_.toLong).find(k => twelve.bucketOf(hashOf(k)) != twelve.bucketOf(hashOf(9L))).get
      finally twelve.close()
    engine.live.loadEntry(Entry(keyOf(stray), value(3L)))
    model += stray -> 3L
    models(13) = model
    assert(snapshot() == 13)
    assert(engine.snapshotsFromChangedBuckets == 2 && engine.snapshotsRefusedChangedOnly == ((0L, 1L)))
    assert(reusedBefore.last == 0, "the snapshot written after a miscount copied buckets")
    // The refused write left no file behind: no temporary file, and the store's files are its own.
    val left = new java.io.File(dir.toUri.getPath).list().toSeq
    assert(left.forall(n => n.endsWith(".hs-snapshot") || n.endsWith(".hs-journal")), left)
    // Twice the keys: another split than the base's, so every key is viewed, and nothing copied.
    commit(13)(cs => (200000L until 220000L).foreach(k => put(cs, k, k)))
    assert(snapshot() == 14)
    assert(reusedBefore.last == 0 && engine.snapshotsFromChangedBuckets == 2)
    // Each snapshot's lists of entries were made as long as its state's keys at once (a writer
    // with no count to go by grows them five times for 20,000 keys).
    assert(engine.snapshotEntryListGrowths == 0)
    for (f <- files.list().filter(_.kind == StateFileNames.Snapshot)) {
      assertHolds(files, f, models(f.version))
    }
    // The base's account: 2^(bits + 1) bits for a state of 2^bits buckets, counted in memoryUsedBytes.
    val bits = StateFileFormat.bucketBitsFor(engine.live.recordBytes, 256)
    assert(engine.reuseAccountBytes == new TouchedBuckets(bits + 1).heapBytes)
    engine.close()
    assert(engine.reuseAccountBytes == 0)
  }

  test("a commit whose puts moved to pages counts every bucket as changed: the next snapshot views every key") {
    val files = new StateFiles(new Path(StoreFixture.tempDir(), "store"), new Configuration(), 0)
    val engine = new StateEngine(files, EngineSettings(4, Codec.Zstd, 2, 1000, snapshotBucketBytes = 256), None)
    // Records of about 170 bytes in buckets of 256: about one key a bucket, so about a third of
    // the base's buckets are empty, and no commit that empties the state touches them.
    def value(k: Long) = Array.tabulate[Byte](150)(i => (k * 31 + i).toByte)
    var model = Map.empty[Long, Seq[Byte]]
    def commit(v: Long, pagesFrom: Int = ChangeSet.PagesFrom)(changes: ChangeSet => Unit): ChangeSet = {
      engine.ensureAt(v)
      val cs = new ChangeSet(engine.live, pagesFrom)
      changes(cs)
      engine.commit(v, cs)
      cs
    }
    def put(cs: ChangeSet, k: Long): Unit = {
      val key = Key(keyOf(k)); cs.put(key, Entry(key.bytes, value(k))); model += k -> value(k).toSeq
    }
    engine.ensureAt(0)
    commit(0)(cs => (0L until 2000L).foreach(put(cs, _)))
    assert(engine.snapshotIfDue(force = true).contains(1))
    commit(1) { cs => (0L until 2000L).foreach(k => cs.remove(Key(keyOf(k)))); model = Map.empty }
    // On the empty state, the puts past the first 64 move to pages, which the commit copies whole.
    val paged = commit(2, pagesFrom = 64)(cs => (10000L until 12000L).foreach(put(cs, _)))
    assert(paged.pagedPuts != null && paged.pagedPuts.size > 1900)
    val base = files.openSnapshot(snapshotIn(files, 1L)).get
    val bits =
      try {
        // With its dictionary, so that the snapshot after it could copy from it.
        assert(base.dictionary != null, "the base was written without a dictionary")
        val empty = (0 until base.buckets).count(base.recordCount(_) == 0)
        assert(empty > base.buckets / 5, s"$empty of ${base.buckets} buckets of the base are empty")
        base.bucketBits
      } finally base.close()
    assert(StateFileFormat.bucketBitsFor(engine.live.recordBytes, 256) == bits, "the split must be the base's")
    val reused = engine.snapshotBucketsReused
    assert(engine.snapshotIfDue(force = true).contains(3))
    // Every key viewed, no bucket copied, and no view of the changed buckets alone tried (without
    // every bucket counted, that view misses the keys in the base's empty buckets, and the writer refuses it).
    assert(engine.snapshotBucketsReused == reused && engine.snapshotsFromChangedBuckets == 0)
    assert(engine.snapshotsRefusedChangedOnly == ((0L, 0L)))
    val got = mutable.Map.empty[Long, Seq[Byte]]
    files.read(snapshotIn(files, 3L))(
      (k, v) => got(java.nio.ByteBuffer.wrap(k).getLong) = v.toSeq, _ => fail("a delete in a snapshot"))
    assert(got.toMap == model)
    engine.close()
  }

  test("a snapshot whose base file is damaged or gone compresses every bucket, and holds its version") {
    def run(spoil: (StateFiles, StateFileNames.StateFile) => Unit): Long = {
      val store = new Store(new Path(StoreFixture.tempDir(), "store"), new Configuration())
      import store._
      engine.ensureAt(0)
      commit(0)(0L until 5000L)
      engine.snapshotIfDue(force = true)
      commit(1)(Seq(7L, 8L))
      spoil(files, snapshotFile(1))
      assert(engine.snapshotIfDue(force = true).contains(2))
      assertHolds(files, snapshotFile(2), model)
      engine.close()
      engine.snapshotBucketsReused
    }
    assert(run((_, _) => ()) > 0, "the control copied nothing")
    assert(run((_, f) => flipMiddleByte(new java.io.File(f.path.toUri.getPath))) == 0)
    assert(run((files, f) => files.delete(f.path)) == 0)
  }

  /** Flips every bit of the byte in the middle of `f`. */
  private def flipMiddleByte(f: java.io.File): Unit = {
    val raf = new java.io.RandomAccessFile(f, "rw")
    try { raf.seek(f.length / 2); val b = raf.read(); raf.seek(f.length / 2); raf.write(b ^ 0xff) }
    finally raf.close()
  }

  /** A Hadoop configuration under which a store's directory counts as off the local disk. */
  private def offLocal(): Configuration = {
    val conf = new Configuration()
    conf.set(StateFiles.FileManagerClassKey, StoreFixture.FileContextManager)
    conf
  }

  /** An engine over `dir` with 256-byte buckets and its model: `commit(v)(keys)` sets each key to key + v. */
  private final class Store(dir: Path, conf: Configuration) {
    val files = new StateFiles(dir, conf, 0)
    val engine = new StateEngine(files, EngineSettings(100, Codec.Zstd, 2, 1000, snapshotBucketBytes = 256), None)
    var model = Map.empty[Long, Long]
    def commit(v: Long)(keys: Seq[Long]): Unit = {
      engine.ensureAt(v)
      val cs = new ChangeSet(engine.live)
      keys.foreach { k =>
        val key = Key(keyOf(k))
        cs.put(key, Entry(key.bytes, java.nio.ByteBuffer.allocate(8).putLong(k + v).array()))
        model += k -> (k + v)
      }
      engine.commit(v, cs)
    }
    def snapshotFile(v: Long): StateFileNames.StateFile = snapshotIn(files, v)
    def bytesOf(f: StateFileNames.StateFile): Seq[Byte] =
      java.nio.file.Files.readAllBytes(new java.io.File(f.path.toUri.getPath).toPath).toSeq
    /** The local copies the store keeps, by name, and their bytes (not the directory's lock file). */
    def copies: Map[String, Seq[Byte]] =
      files.copyDirectory.toSeq.flatMap(d => Option(d.listFiles()).toSeq.flatten)
        .filterNot(_.getName == CopyDirs.OwnerFileName)
        .map(f => f.getName -> java.nio.file.Files.readAllBytes(f.toPath).toSeq).toMap
  }

  /**
   * Writes a store of keys 0 to 19,999 at `dir` off the local disk, snapshots it at version 1,
   * runs `later` on it (the commits of versions 1 and up), and closes it; returns its model.
   */
  private def writeAndClose(dir: Path)(later: Store => Unit): Map[Long, Long] = {
    val first = new Store(dir, offLocal())
    first.engine.ensureAt(0)
    first.commit(0)(0L until 20000L)
    assert(first.engine.snapshotIfDue(force = true).contains(1))
    later(first)
    first.engine.close()
    first.model
  }

  test("off the local disk, a snapshot copies unchanged buckets from a local copy of its base, which close deletes") {
    val store = new Store(new Path(StoreFixture.tempDir(), "store"), offLocal())
    import store._
    assert(!files.isLocal)
    engine.ensureAt(0)
    commit(0)(0L until 5000L)
    assert(engine.snapshotIfDue(force = true).contains(1))
    assert(engine.snapshotBucketsReused == 0)
    val first = snapshotFile(1)
    assert(copies == Map(first.path.getName -> bytesOf(first)), "the copy is not the snapshot, byte for byte")
    commit(1)(Seq(7L, 8L))
    commit(2)(Seq(9L, 5000L))
    assert(engine.snapshotIfDue(force = true).contains(3))
    val reused = engine.snapshotBucketsReused
    assert(reused > 0, "nothing was copied from the local copy of snapshot 1")
    val third = snapshotFile(3)
    assertHolds(files, third, model)
    val fresh = new StateFiles(new Path(StoreFixture.tempDir(), "fresh"), new Configuration(), 0)
    fresh.writeSnapshot(3, Codec.Zstd, 256, dictionary = dictionaryOf(files, 3))(w =>
      engine.live.writeSnapshotView(3, w.putEntry(_, _, _)))
    assert(bytesOf(third) == bytesOf(fresh.list().head))
    assert(copies == Map(third.path.getName -> bytesOf(third)), "the copy of snapshot 1 was not replaced by 3's")
    // A cleaner of the temporary directory removes the copies: the next snapshot makes the directory again.
    val removed = files.copyDirectory.get
    removed.listFiles().foreach(_.delete()); assert(removed.delete())
    commit(3)(Seq(11L))
    assert(engine.snapshotIfDue(force = true).contains(4))
    assertHolds(files, snapshotFile(4), model)
    assert(copies == Map(snapshotFile(4).path.getName -> bytesOf(snapshotFile(4))))
    val dir = files.copyDirectory.get
    assert(dir != removed && new java.io.File(dir, CopyDirs.OwnerFileName).isFile,
      "the directory made again is not claimed")
    engine.close()
    assert(!dir.exists(), s"close left $dir")
  }

  test("off the local disk, a damaged or missing local copy makes the next snapshot compress every bucket") {
    for ((what, spoil) <- Seq[(String, java.io.File => Unit)](
        "damaged" -> flipMiddleByte,
        "truncated" -> { f =>
          val raf = new java.io.RandomAccessFile(f, "rw");
          try raf.setLength(f.length - 1)
          finally raf.close()
        },
        "deleted" -> { f => assert(f.delete()) }
      )) {
      val store = new Store(new Path(StoreFixture.tempDir(), "store"), offLocal())
      import store._
      engine.ensureAt(0)
      commit(0)(0L until 5000L)
      engine.snapshotIfDue(force = true)
      commit(1)(Seq(7L, 8L))
      files.copyDirectory.get.listFiles().filterNot(_.getName == CopyDirs.OwnerFileName).foreach(spoil)
      assert(engine.snapshotIfDue(force = true).contains(2))
      assert(engine.snapshotBucketsReused == 0, s"buckets were copied from a $what local copy")
      assertHolds(files, snapshotFile(2), model)
      // The snapshot just written is the next one's base again.
      assert(copies == Map(snapshotFile(2).path.getName -> bytesOf(snapshotFile(2))))
      engine.close()
    }
  }

  test("off the local disk, a restart loads from a local copy of its snapshot, and its first snapshot copies from it") {
    val dir = new Path(StoreFixture.tempDir(), "store")
    val written = writeAndClose(dir)(first => for (v <- 1L until 4L) first.commit(v)((v * 7) until 20000L by 401L))
    val store = new Store(dir, offLocal())
    import store._
    model = written
    engine.ensureAt(4) // snapshot 1 and journals 2 to 4
    assert(copies == Map(snapshotFile(1).path.getName -> bytesOf(snapshotFile(1))),
      "the restart kept no copy of the snapshot it loaded")
    commit(4)(Seq(12345L))
    engine.live.loadAll()
    assert(engine.snapshotIfDue(force = true).contains(5))
    assert(engine.snapshotBucketsReused > 0, "the first snapshot after the restart copied nothing")
    assertHolds(files, snapshotFile(5), model)
    assert(copies == Map(snapshotFile(5).path.getName -> bytesOf(snapshotFile(5))))
    engine.close()
  }

  test("off the local disk, a restart whose local copy cannot be opened reads the snapshot itself and keeps no copy") {
    val dir = new Path(StoreFixture.tempDir(), "store")
    val written = writeAndClose(dir)(_.commit(1)(Seq(5L, 6L)))
    val store = new Store(dir, offLocal())
    import store._
    model = written
    var tried = Seq.empty[Boolean] // whether the copy it was asked to open was there
    val mapCopy = files.mapCopy
    files.mapCopy = (f, _, _, _) => { tried :+= f.isFile; throw new java.io.IOException(s"no mapping of $f") }
    engine.ensureAt(2) // snapshot 1 and journal 2
    assert(tried == Seq(true), "the restart did not try its downloaded local copy once")
    files.mapCopy = mapCopy
    assert(copies.isEmpty, "the copy that could not be opened was kept")
    engine.live.loadAll()
    assert(engine.live.numKeys == model.size)
    commit(2)(Seq(7L))
    assert(engine.snapshotIfDue(force = true).contains(3))
    assert(engine.snapshotBucketsReused == 0, "buckets were copied with no copy to copy them from")
    assertHolds(files, snapshotFile(3), model)
    // The snapshot just written keeps its copy: the next one copies from it.
    assert(copies == Map(snapshotFile(3).path.getName -> bytesOf(snapshotFile(3))))
    commit(3)(Seq(8L))
    assert(engine.snapshotIfDue(force = true).contains(4))
    assert(engine.snapshotBucketsReused > 0)
    assertHolds(files, snapshotFile(4), model)
    engine.close()
  }

  test("off the local disk, the stores of a JVM take the roots of local copies in turn, past one that fails") {
    val base = new java.io.File(StoreFixture.tempDir())
    val Seq(a, b, c) = Seq("a", "b", "c").map(new java.io.File(base, _)) // made when first needed
    val bad = new java.io.File(base, "a-file")
    java.nio.file.Files.write(bad.toPath, Array[Byte](1))
    /** The root under which a new store's directory of copies is made, once it looks for a copy; None without one. */
    def rootOf(roots: Seq[java.io.File]): Option[java.io.File] = {
      val files = new StateFiles(new Path(StoreFixture.tempDir(), "store"), offLocal(), 0, roots)
      assert(files.openCopy(1, None, 100).isEmpty)
      val root = files.copyDirectory.map(_.getParentFile)
      assert(files.mayCopy == root.isDefined)
      files.deleteCopies()
      root
    }
    assert(Seq.fill(3)(rootOf(Seq(a, b, c))).flatten.toSet == Set(a, b, c))
    assert(Seq.fill(2)(rootOf(Seq(bad, b))) == Seq(Some(b), Some(b)))
    val (none, log) = StoreFixture.logged(classOf[StateFiles])(rootOf(Seq(bad, new java.io.File(bad, "below"))))
    assert(none.isEmpty)
    assert(
      log.exists { case (level, m) =>
        level == "WARN" && m.contains(HeapStateConf.LocalCopyDir.key) && m.contains(bad.getPath)
      }, log)
  }

  test("off the local disk, a store deletes the directories of local copies that ended JVMs left, and only those") {
    val root = new java.io.File(StoreFixture.tempDir())
    /** A directory under `root` as a JVM leaves it, with an `.owner` file or without. */
    def left(name: String, owner: Boolean): java.io.File = {
      val d = new java.io.File(root, name)
      assert(d.mkdirs())
      java.nio.file.Files.write(new java.io.File(d, "7.hs-snapshot").toPath, Array[Byte](1, 2, 3))
      if (owner) java.nio.file.Files.write(new java.io.File(d, CopyDirs.OwnerFileName).toPath, Array.emptyByteArray)
      d
    }
    val killed = left("heapstate-op0-p1-111", owner = true) // its JVM ended: nobody holds its .owner
    val older = left("heapstate-op0-p2-222", owner = false) // no .owner: a heapstate before claims
    val notOurs = left("spark-333", owner = true)
    val live = left("heapstate-op0-p3-444", owner = true)
    /** `python3` running `script` on `file` (its `sys.argv[1]`). */
    def python(script: String, file: java.io.File): Process =
      new ProcessBuilder("python3", "-c", script, file.getPath).redirectErrorStream(true).start()
    /** A process that locks `file` as another JVM's claim does (POSIX record locks), until killed. */
    def holder(file: java.io.File): Process = {
      val p = python(
        "import fcntl, sys, time\nf = open(sys.argv[1], 'r+')\nfcntl.lockf(f, fcntl.LOCK_EX)\n" +
          "print('locked', flush=True)\ntime.sleep(300)",
        file)
      val line = new java.io.BufferedReader(new java.io.InputStreamReader(p.getInputStream)).readLine()
      assert(line == "locked", s"the lock holder said $line")
      p
    }
    /** Whether another process can lock `file` now (the holder's script, without waiting). */
    def lockableElsewhere(file: java.io.File): Boolean = {
      val code = python(
        "import fcntl, sys\nf = open(sys.argv[1], 'r+')\ntry:\n  fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n" +
          "except OSError:\n  sys.exit(3)",
        file).waitFor()
      assert(code == 0 || code == 3, s"the lock probe exited $code")
      code == 0
    }
    val liveHolder = holder(new java.io.File(live, CopyDirs.OwnerFileName))
    try {
      // The first store of this JVM to make a directory under the root sweeps it.
      val first = new StateFiles(new Path(StoreFixture.tempDir(), "store"), offLocal(), 0, Seq(root), "op0-p0")
      val logger = CopyDirs.getClass.getName
      val level = org.apache.logging.log4j.LogManager.getLogger(logger).getLevel
      org.apache.logging.log4j.core.config.Configurator.setLevel(logger, org.apache.logging.log4j.Level.INFO)
      val (_, log) =
        try StoreFixture.logged(CopyDirs.getClass)(assert(first.openCopy(1, None, 100).isEmpty))
        finally org.apache.logging.log4j.core.config.Configurator.setLevel(logger, level)
      val mine = first.copyDirectory.get
      assert(mine.getName.startsWith(s"heapstate-op0-p0-pid${ProcessHandle.current.pid}-"), mine.getName)
      assert(!killed.exists(), "the directory a killed JVM left was kept")
      assert(log.exists { case (level, m) => level == "INFO" && m.contains(killed.getPath) }, log)
      assert(older.exists() && notOurs.exists() && live.exists())
      val mineOwner = new java.io.File(mine, CopyDirs.OwnerFileName)
      assert(mineOwner.isFile && !lockableElsewhere(mineOwner), "this JVM holds no lock on its own directory")
      // A sweep keeps this JVM's directory, under another path to it too, and keeps holding its lock.
      val aliased = new java.io.File(StoreFixture.tempDir(), "alias")
      java.nio.file.Files.createSymbolicLink(aliased.toPath, root.toPath)
      assert(CopyDirs.sweep(root) == 0 && CopyDirs.sweep(aliased) == 0)
      assert(mine.isDirectory && !lockableElsewhere(mineOwner), "a sweep dropped this JVM's lock")
      // Its copies come and go; its lock file stays.
      first.retainCopy(None)
      assert(mineOwner.isFile && !lockableElsewhere(mineOwner))
      // Once the live process ends, its directory is left behind too.
      liveHolder.destroyForcibly().waitFor()
      assert(CopyDirs.sweep(root) == 1 && !live.exists())
      assert(older.exists() && notOurs.exists() && mine.isDirectory)
      first.deleteCopies()
      assert(!mine.exists())
    } finally liveHolder.destroyForcibly()
  }

  test("a directory of local copies is named after its store's operator, partition and store name") {
    assert(StateFiles.copyNameOf(3, 7, StateStoreId.DEFAULT_STORE_NAME) == "op3-p7")
    assert(StateFiles.copyNameOf(3, 7, "left-keyToNumValues") == "op3-p7-left-keyToNumValues")
    val root = new java.io.File(StoreFixture.tempDir())
    /** The name of the directory of copies a store with `copyName` makes, up to its random part. */
    def dirName(copyName: String): String = {
      val files = new StateFiles(new Path(StoreFixture.tempDir(), "store"), offLocal(), 5, Seq(root), copyName)
      assert(files.openCopy(1, None, 100).isEmpty)
      val name = files.copyDirectory.get.getName
      assert(files.copyDirectory.get.getParentFile == root)
      files.deleteCopies()
      name
    }
    assert(dirName("op3-p5-left-keyToNumValues").startsWith("heapstate-op3-p5-left-keyToNumValues-"))
    assert(dirName("").startsWith("heapstate-p5-")) // no name given: the partition
    assert(dirName("op3-p5-a/b c").startsWith("heapstate-op3-p5-a_b_c-")) // made safe for a file name
  }

  test("off the local disk, with no room for local copies, snapshots are written and restarts read them") {
    val dir = new Path(StoreFixture.tempDir(), "store")
    val saved = System.getProperty("java.io.tmpdir")
    val blocked = new java.io.File(StoreFixture.tempDir(), "not-a-directory")
    java.nio.file.Files.write(blocked.toPath, Array[Byte](1))
    System.setProperty("java.io.tmpdir", blocked.getPath)
    try {
      val store = new Store(dir, offLocal())
      import store._
      engine.ensureAt(0)
      commit(0)(0L until 5000L)
      assert(engine.snapshotIfDue(force = true).contains(1))
      commit(1)(Seq(7L, 8L))
      assert(engine.snapshotIfDue(force = true).contains(2))
      assert(engine.snapshotBucketsReused == 0 && files.copyDirectory.isEmpty)
      assertHolds(files, snapshotFile(2), model)
      engine.close()
      val again = new Store(dir, offLocal())
      again.engine.ensureAt(2)
      again.engine.live.loadAll()
      again.commit(2)(Seq(9L))
      assert(again.engine.snapshotIfDue(force = true).contains(3))
      assertHolds(again.files, again.snapshotFile(3), model + (9L -> 11L))
      again.engine.close()
    } finally System.setProperty("java.io.tmpdir", saved)
  }

  test(
    "a restarted engine's first snapshot copies from the snapshot it was rebuilt from what the journals left alone") {
    val dir = new Path(StoreFixture.tempDir(), "store")
    val settings = EngineSettings(100, Codec.Zstd, 2, 1000, snapshotBucketBytes = 256)
    def value(v: Long) = java.nio.ByteBuffer.allocate(8).putLong(v).array()
    var model = Map.empty[Long, Long]
    def commit(engine: StateEngine, v: Long)(changes: ChangeSet => Unit): Unit = {
      engine.ensureAt(v)
      val cs = new ChangeSet(engine.live)
      changes(cs)
      engine.commit(v, cs)
    }
    def put(cs: ChangeSet, k: Long, x: Long): Unit = {
      val key = Key(keyOf(k)); cs.put(key, Entry(key.bytes, value(x))); model += k -> x
    }
    def remove(cs: ChangeSet, k: Long): Unit = { cs.remove(Key(keyOf(k))); model -= k }
    val first = new StateEngine(new StateFiles(dir, new Configuration(), 0), settings, None)
    first.ensureAt(0)
    commit(first, 0)(cs => (0L until 20000L).foreach(k => put(cs, k, k)))
    assert(first.snapshotIfDue(force = true).contains(1))
    // Journals 2 to 4: updates, removals and new keys, then the engine goes away.
    for (v <- 1L until 4L) commit(first, v) { cs =>
      for (k <- (v * 7) until 20000L by 401L) put(cs, k, -k)
      remove(cs, v * 1000 + 3)
      put(cs, 50000L + v, v)
    }
    first.close()
    val files = new StateFiles(dir, new Configuration(), 0)
    val engine = new StateEngine(files, settings, None)
    engine.ensureAt(4) // snapshot 1 and journals 2 to 4
    commit(engine, 4)(cs => put(cs, 12345L, 1L))
    engine.live.loadAll()
    assert(engine.snapshotIfDue(force = true).contains(5))
    val reused = engine.snapshotBucketsReused
    assert(reused > 0, "the first snapshot after the restart copied nothing")
    val snapshot5 = snapshotIn(files, 5L)
    assertHolds(files, snapshot5, model)
    val fresh = new StateFiles(new Path(StoreFixture.tempDir(), "fresh"), new Configuration(), 0)
    fresh.writeSnapshot(5, Codec.Zstd, 256, dictionary = dictionaryOf(files, 5))(w =>
      engine.live.writeSnapshotView(5, w.putEntry(_, _, _)))
    def bytesOf(fs: StateFiles) =
      java.nio.file.Files.readAllBytes(new java.io.File(fs.snapshotPath(5).toUri.getPath).toPath).toSeq
    assert(bytesOf(files) == bytesOf(fresh))
    engine.close()
  }

  test("with checkpoint ids (format v2), a snapshot copies from the live lineage's snapshot, and names its own id") {
    val files = new StateFiles(new Path(StoreFixture.tempDir(), "store"), new Configuration(), 0)
    val engine = new StateEngine(files, EngineSettings(100, Codec.Zstd, 2, 1000, snapshotBucketBytes = 256), None)
    def value(v: Long) = java.nio.ByteBuffer.allocate(8).putLong(v).array()
    var model = Map.empty[Long, Long]
    val ids = mutable.Map[Long, String]()
    def commit(v: Long)(keys: Seq[Long]): Unit = {
      engine.ensureAt(v, ids.get(v))
      val cs = new ChangeSet(engine.live)
      keys.foreach { k =>
        val key = Key(keyOf(k)); cs.put(key, Entry(key.bytes, value(k + v))); model += k -> (k + v)
      }
      val id = java.util.UUID.randomUUID().toString
      engine.commit(v, cs, ids.get(v), Some(id))
      ids(v + 1) = id
    }
    engine.ensureAt(0)
    commit(0)(0L until 5000L)
    assert(engine.snapshotIfDue(force = true).contains(1))
    commit(1)(Seq(7L, 8L))
    commit(2)(Seq(9L))
    assert(engine.snapshotIfDue(force = true).contains(3))
    assert(engine.snapshotBucketsReused > 0, "nothing was copied from the snapshot of version 1")
    val snapshots = files.list().filter(_.kind == StateFileNames.Snapshot).sortBy(_.version)
    assert(snapshots.map(f => f.version -> f.id) == Seq(1L -> Some(ids(1)), 3L -> Some(ids(3))))
    assertHolds(files, snapshots.last, model)
    engine.close()
  }
}
