package heapstate

import java.util.concurrent.atomic.AtomicBoolean

import scala.collection.mutable

import org.apache.spark.unsafe.Platform
import org.scalatest.funsuite.AnyFunSuite

import heapstate.engine.{Entry, EntryTable, Key}

/** The live state's open-addressing table against a model, and under a concurrent iterator. */
class EntryTableSuite extends AnyFunSuite {
  private def keyBytes(k: Int): Array[Byte] = {
    // Keys of varying length, so key-length checks matter, not just the bytes.
    val b = new Array[Byte](4 + (k % 5))
    Platform.putInt(b, Platform.BYTE_ARRAY_OFFSET, k)
    b
  }
  private def entry(k: Int, v: Long): Array[Byte] = {
    val value = new Array[Byte](8 + (v % 3).toInt.abs)
    Platform.putLong(value, Platform.BYTE_ARRAY_OFFSET, v)
    Entry(keyBytes(k), value)
  }
  private def valueOf(e: Array[Byte]): Long = Platform.getLong(e, Platform.BYTE_ARRAY_OFFSET + Entry.valueStart(e))
  private def contents(t: EntryTable): Map[Int, Long] = {
    val out = mutable.Map.empty[Int, Long]
    t.foreach { e =>
      val k = Platform.getInt(e, Platform.BYTE_ARRAY_OFFSET + Entry.keyStart)
      assert(!out.contains(k), s"key $k twice")
      out(k) = valueOf(e)
    }
    out.toMap
  }

  test("random puts, updates and removes match a model, through resizes and reused slots") {
    val rnd = new scala.util.Random(11)
    val t = new EntryTable()
    var model = Map.empty[Int, Long]
    for (step <- 0 until 200000) {
      val k = rnd.nextInt(if (step < 100000) 50000 else 2000) // grow, then churn a small set
      if (rnd.nextInt(3) == 0) {
        val kb = keyBytes(k)
        val removed = t.remove(kb, Platform.BYTE_ARRAY_OFFSET, kb.length, Key(kb).hashCode)
        assert((removed != null) == model.contains(k))
        model -= k
      } else {
        val v = rnd.nextLong()
        val e = entry(k, v)
        val old = t.put(e, Entry.keyHash(e))
        assert((old != null) == model.contains(k))
        if (old != null) assert(valueOf(old) == model(k))
        model += k -> v
      }
      if (step % 20000 == 0) assert(contents(t) == model)
    }
    assert(t.size == model.size)
    assert(contents(t) == model)
    for (k <- 0 until 50000) {
      val kb = keyBytes(k)
      val e = t.get(Key(kb))
      assert(Option(e).map(valueOf) == model.get(k), s"key $k")
    }
    assert(t.iterator.map(valueOf).toSeq.sorted == model.values.toSeq.sorted)
    // Churn on a small key set must not grow the table: removals' slots are reclaimed.
    assert(t.capacity <= EntryTable.capacityFor(50000) * 2, t.capacity)
  }

  test("an iterator running beside the writer sees each key once, with a value it had") {
    val t = new EntryTable()
    val stable = 0 until 20000 // never touched while iterating: must all be seen, unchanged
    stable.foreach(k => { val e = entry(k, k.toLong); t.put(e, Entry.keyHash(e)) })
    val stop = new AtomicBoolean(false)
    val writer = new Thread(() => {
      val rnd = new scala.util.Random(3)
      var i = 0
      while (!stop.get()) {
        val k = 20000 + rnd.nextInt(100000) // inserts force resizes while the reader runs
        if (rnd.nextBoolean()) { val e = entry(k, -k.toLong); t.put(e, Entry.keyHash(e)) }
        else { val kb = keyBytes(k); t.remove(kb, Platform.BYTE_ARRAY_OFFSET, kb.length, Key(kb).hashCode) }
        i += 1
      }
    })
    writer.start()
    try {
      for (_ <- 0 until 30) {
        val seen = mutable.Map.empty[Int, Long]
        t.foreach { e =>
          val k = Platform.getInt(e, Platform.BYTE_ARRAY_OFFSET + Entry.keyStart)
          assert(!seen.contains(k), s"key $k seen twice")
          seen(k) = valueOf(e)
        }
        stable.foreach(k => assert(seen.get(k).contains(k.toLong), s"stable key $k"))
        seen.foreach { case (k, v) => if (k >= 20000) assert(v == -k.toLong, s"key $k has foreign value $v") }
      }
    } finally { stop.set(true); writer.join() }
  }
}
