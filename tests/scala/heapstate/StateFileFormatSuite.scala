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
    val size = w.finish()
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
    StateFileReader.readEntries(new ByteArrayInputStream(bytes), bytes.length, path, 7, StateFileFormat.KindJournal,
      e => got += ((engine.Entry.key(e).toSeq, Some(engine.Entry.value(e).toSeq))), k => got += ((k.toSeq, None)))
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
    w.finish()
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
    val badBody = bytes.clone(); badBody(StateFileFormat.HeaderBytes + 5) = (badBody(StateFileFormat.HeaderBytes + 5) ^ 0xff).toByte
    intercept[StateFileException](read(badBody))
    assertRejected(write(Codec.Zstd, records, version = 8), "name says version 7")
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
    for (n <- Seq(Name(12L, Journal, Some(a), Some(b)), Name(1L, Journal, Some(a), None), Name(3L, Journal, None, None))) {
      assert(StateFileNames.parse(StateFileNames.journal(dir, n.version, n.id, n.base).getName).contains(n))
    }
    Seq("12.delta", "10.snapshot", ".12.hs-journal.tmp", "x.hs-journal", ".hs-journal", "-1.hs-journal",
      s"10_${a}_$b.hs-snapshot", s"12_${a}_${b}_$a.hs-journal", "12_.hs-journal", "12__x.hs-journal", "12_a b.hs-journal",
      "12_x.y.hs-journal")
      .foreach(n => assert(StateFileNames.parse(n).isEmpty, n))
  }
}
