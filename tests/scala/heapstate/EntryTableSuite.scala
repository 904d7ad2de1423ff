package heapstate

import java.util.concurrent.atomic.AtomicBoolean

import scala.collection.mutable

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.unsafe.Platform
import org.scalatest.funsuite.AnyFunSuite

import heapstate.engine.{BucketSet, ChangeSet, Entry, EntryTable, Key, LiveState}
import heapstate.io.StateFileFormat

/** The live state's paged, open-addressing table against a model, and under a concurrent iterator. */
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
  private def valueOf(b: Array[Byte], at: Int): Long =
    Platform.getLong(b, Platform.BYTE_ARRAY_OFFSET + Entry.valueStart(b, at))
  private def valueOf(e: Array[Byte]): Long = valueOf(e, 0)
  private def keyOf(b: Array[Byte], at: Int): Int = Platform.getInt(b, Platform.BYTE_ARRAY_OFFSET + Entry.keyStart(at))
  private def valueAt(t: EntryTable, address: Long): Long = valueOf(t.pageOf(address), t.offsetOf(address))
  private def keyAt(t: EntryTable, address: Long): Int = keyOf(t.pageOf(address), t.offsetOf(address))
  private def contents(t: EntryTable): Map[Int, Long] = {
    val out = mutable.Map.empty[Int, Long]
    t.foreach { (b, at) =>
      val k = keyOf(b, at)
      assert(!out.contains(k), s"key $k twice")
      out(k) = valueOf(b, at)
    }
    out.toMap
  }

  /**
   * One [[EntryTable.foreach]] of `t` beside its writer: each key met once, with `value(key)` (the
   * one value the writer puts for it), and every key of `stable` met.
   */
  private def iterateBeside(t: EntryTable, stable: Range, value: Int => Long): Unit = {
    val seen = mutable.Map.empty[Int, Long]
    t.foreach { (b, at) =>
      val k = keyOf(b, at)
      val twice = seen.contains(k) // not in the assertion: its message would print every key seen
      assert(!twice, s"key $k seen twice")
      seen(k) = valueOf(b, at)
    }
    stable.foreach(k => assert(seen.get(k).contains(value(k)), s"stable key $k"))
    seen.foreach { case (k, v) => assert(v == value(k), s"key $k has foreign value $v") }
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
        assert(removed == model.get(k).map(v => entry(k, v).length).getOrElse(-1))
        model -= k
      } else {
        val v = rnd.nextLong()
        val e = entry(k, v)
        val old = t.put(e, Entry.keyHash(e))
        assert(old == model.get(k).map(v => entry(k, v).length).getOrElse(-1)) // the replaced entry's length
        model += k -> v
      }
      if (step % 97 == 0) t.compact() // as commits do: moves live entries out of the emptiest pages
      if (step % 20000 == 0) { assert(contents(t) == model); t.checkAccounts() }
    }
    assert(t.size == model.size)
    assert(contents(t) == model)
    t.checkAccounts()
    assert(t.entryBytes == model.map { case (k, v) => entry(k, v).length.toLong }.sum)
    val row = new UnsafeRow(1)
    for (k <- 0 until 50000) {
      val kb = keyBytes(k)
      val a = t.find(Key(kb))
      assert((if (a == EntryTable.NoEntry) None else Some(valueAt(t, a))) == model.get(k), s"key $k")
      // A get's one step: the row points at the value, of the entry's value length.
      val found = t.pointToValue(kb, Platform.BYTE_ARRAY_OFFSET, kb.length, Key(kb).hashCode, row)
      val pointed =
        if (found) Some((Platform.getLong(row.getBaseObject, row.getBaseOffset), row.getSizeInBytes)) else None
      assert(pointed == model.get(k).map(v => (v, 8 + (v % 3).toInt.abs)), s"key $k, pointToValue")
    }
    assert(t.iterator.map(valueAt(t, _)).toSeq.sorted == model.values.toSeq.sorted)
    // Churn on a small key set must not grow the table: removals' slots are reclaimed.
    assert(t.capacity <= EntryTable.capacityFor(50000) * 2, t.capacity)
    assert(t.heapBytes == t.heapBytesRecounted)
  }

  test("look-ups tell apart keys of one hash that differ in a word, in a byte past the words, or in length") {
    // Every key here is put and looked up with the same hash, so each shares its slot's tag and
    // home with the others and every look-up compares it with the keys put before it.
    val hash = 0x5bd1e995
    val word = Array.tabulate[Byte](16)(j => (j * 7 + 1).toByte)
    def differing(at: Int) = { val b = word.clone(); b(at) = (b(at) ^ 0x40).toByte; b }
    val keys = Seq(
      word, // 16 bytes, two words
      differing(3), // differs in its first word
      differing(12), // in its second
      word ++ Array.fill[Byte](8)(0), // longer: the 16 bytes above, then a word of zeros
      word ++ Array[Byte](5), // 17 bytes: the 16 bytes above, then a byte
      word ++ Array[Byte](6), // 17 bytes too: differs from the one above in its last byte only
      word.take(8), // shorter: the first word alone
      word.take(15) ++ Array[Byte](word(15)) // equal to the first, in another array
    )
    val t = new EntryTable()
    def lookUp(k: Array[Byte]): Long = t.find(k, Platform.BYTE_ARRAY_OFFSET, k.length, hash)
    for ((k, i) <- keys.zipWithIndex.init) {
      keys.take(i).foreach(earlier => assert(lookUp(earlier) != EntryTable.NoEntry))
      assert(lookUp(k) == EntryTable.NoEntry, s"key $i before it was put")
      val v = new Array[Byte](8); Platform.putLong(v, Platform.BYTE_ARRAY_OFFSET, i)
      assert(t.put(Entry(k, v), hash) == -1, s"key $i")
    }
    for ((k, i) <- keys.zipWithIndex.init) assert(valueAt(t, lookUp(k)) == i, s"key $i")
    assert(valueAt(t, lookUp(keys.last)) == 0, "the first key, from another array")
  }

  test("look-ups match keys of 9 to 24 bytes, and tell apart two that share a slot's tag and home") {
    val t = new EntryTable()
    def valueBytes(i: Int) = { val v = new Array[Byte](8); Platform.putLong(v, Platform.BYTE_ARRAY_OFFSET, i); v }
    val row = new UnsafeRow(1)
    def assertFound(k: Array[Byte], i: Int): Unit = {
      val hash = Key(k).hashCode
      val a = t.find(k, Platform.BYTE_ARRAY_OFFSET, k.length, hash)
      assert(a != EntryTable.NoEntry && valueAt(t, a) == i, s"key $i")
      assert(t.pointToValue(k, Platform.BYTE_ARRAY_OFFSET, k.length, hash, row), s"key $i")
      assert(Platform.getLong(row.getBaseObject, row.getBaseOffset) == i && row.getSizeInBytes == 8, s"key $i")
    }
    // Two 19-byte keys whose first 16 bytes are equal, with the same slot tag (the hash's top 21
    // bits) and the same home slot: the look-up of the one put second compares its bytes with the
    // first's, which differ only past their first two words.
    val mask = t.capacity - 1
    def key(n: Int): Array[Byte] = {
      val b = Array.fill[Byte](19)(7)
      b(16) = (n >>> 16).toByte; b(17) = (n >>> 8).toByte; b(18) = n.toByte
      b
    }
    val seen = mutable.Map.empty[(Int, Int), Int]
    var pair: (Int, Int) = null
    var n = 0
    while (pair == null) {
      val h = Key(key(n)).hashCode
      val place = (h >>> (32 - 21), h & mask)
      seen.get(place) match { case Some(m) => pair = (m, n); case None => seen(place) = n }
      n += 1
    }
    val (first, second) = pair
    for ((k, i) <- Seq(key(first) -> 0, key(second) -> 1)) assert(t.put(Entry(k, valueBytes(i)), Key(k).hashCode) == -1)
    assert(t.capacity - 1 == mask, "no resize moved the keys apart")
    assertFound(key(first), 0)
    assertFound(key(second), 1)
    // Keys of every length from 9 to 24 bytes.
    val keys = (9 to 24).map(len => Array.tabulate[Byte](len)(j => (j * 31 + len).toByte))
    for ((k, i) <- keys.zipWithIndex) assert(t.put(Entry(k, valueBytes(i + 2)), Key(k).hashCode) == -1)
    for ((k, i) <- keys.zipWithIndex) assertFound(k, i + 2)
    val absent = key(n) // never put
    assert(t.find(absent, Platform.BYTE_ARRAY_OFFSET, absent.length, Key(absent).hashCode) == EntryTable.NoEntry)
    assert(!t.pointToValue(absent, Platform.BYTE_ARRAY_OFFSET, absent.length, Key(absent).hashCode, row))
    // Key.sameBytes on its own, every length to 24 and every place of a difference.
    for (len <- 0 to 24) {
      val a = Array.tabulate[Byte](len)(_.toByte)
      assert(Key.sameBytes(a, Platform.BYTE_ARRAY_OFFSET, a.clone(), Platform.BYTE_ARRAY_OFFSET, len), s"length $len")
      for (at <- 0 until len) {
        val b = a.clone(); b(at) = (b(at) + 1).toByte
        assert(!Key.sameBytes(a, Platform.BYTE_ARRAY_OFFSET, b, Platform.BYTE_ARRAY_OFFSET, len),
          s"length $len, byte $at")
      }
    }
  }

  test("updates leave garbage in the pages, and compaction keeps it near its bound") {
    val rnd = new scala.util.Random(7)
    val t = new EntryTable()
    val keys = 40000
    for (k <- 0 until keys) { val e = entry(k, k); t.put(e, Entry.keyHash(e)) }
    var model = (0 until keys).map(k => k -> k.toLong).toMap
    val slotBytes = 8L * t.capacity
    def pageBytes: Long = t.heapBytes - slotBytes - 4096 // the directory and page counts are a few KiB
    for (round <- 0 until 50) {
      for (_ <- 0 until 4000) { // 10% of the keys a round, at random: every page gets some garbage
        val k = rnd.nextInt(keys)
        val v = rnd.nextLong()
        val e = entry(k, v)
        t.put(e, Entry.keyHash(e))
        model += k -> v
      }
      t.compact()
      t.checkAccounts()
      assert(t.capacity == slotBytes / 8, "updates do not resize")
      // The garbage allowance, the page being filled and the one a compaction stops in the middle of.
      val bound = (1 + EntryTable.GarbageFraction) * t.entryBytes + 3L * t.currentPageBytes
      assert(pageBytes <= bound, s"round $round: $pageBytes bytes of pages for ${t.entryBytes} of entries")
    }
    assert(contents(t) == model)
    assert(t.heapBytes == t.heapBytesRecounted)
    // Without compaction, the same churn piles up garbage: the bound above is compaction's doing.
    val u = new EntryTable()
    for (k <- 0 until keys) { val e = entry(k, k); u.put(e, Entry.keyHash(e)) }
    for (_ <- 0 until 50 * 4000) {
      val k = rnd.nextInt(keys); val e = entry(k, rnd.nextLong()); u.put(e, Entry.keyHash(e))
    }
    assert(u.heapBytes - slotBytes > 3 * u.entryBytes)
  }

  test("a large state's pages are PageBytes long, and young-sized while youngPagesOnly is set") {
    // Under another collector every page is young-sized, and the first check below could not fail.
    assume(EntryTable.PageBytes > EntryTable.YoungPageBytes, "pages are G1-region-sized only when the JVM runs G1")
    val t = new EntryTable()
    t.youngPagesOnly = true
    val value = new Array[Byte](1000)
    var k = 0
    while (t.heapBytes < 8L * EntryTable.PageBytes) {
      val e = Entry(keyBytes(k), value); t.put(e, Entry.keyHash(e)); k += 1
    }
    assert(t.currentPageBytes <= EntryTable.YoungPageBytes, "a loading state's pages stay young-sized")
    t.youngPagesOnly = false
    val held = t.heapBytes
    while (t.heapBytes < held + 2L * EntryTable.PageBytes) {
      val e = Entry(keyBytes(k), value); t.put(e, Entry.keyHash(e)); k += 1
    }
    assert(t.currentPageBytes == EntryTable.PageBytes)
    assert(t.size == k)
    t.checkAccounts()
  }

  test("an address into a page dropped since is refused with an error, not read") {
    val t = new EntryTable()
    val value = new Array[Byte](1000) // about four entries to a first (4 KiB) page
    for (k <- 0 until 20) { val e = Entry(keyBytes(k), value); t.put(e, Entry.keyHash(e)) }
    val stale = t.find(Key(keyBytes(0)))
    val firstPage = t.pageOf(stale)
    // Every key of the first page updated: the page holds nothing live, and is dropped.
    val inFirst = (0 until 20).filter(k => t.pageOf(t.find(Key(keyBytes(k)))) eq firstPage)
    assert(inFirst.size >= 2 && inFirst.contains(0))
    inFirst.foreach { k =>
      val e = Entry(keyBytes(k), new Array[Byte](999)); t.put(e, Entry.keyHash(e))
    }
    val e = intercept[java.util.ConcurrentModificationException](t.pageOf(stale))
    assert(e.getMessage.contains("changed under a reader"))
    assert(t.size == 20)
    t.checkAccounts()
  }

  test("an entry longer than a quarter page gets a page of its own, dropped when the entry goes") {
    val t = new EntryTable()
    val big = Entry(keyBytes(1), new Array[Byte](EntryTable.LargeEntry + 1))
    val small = entry(2, 2)
    t.put(small, Entry.keyHash(small))
    val before = t.heapBytes
    t.put(big, Entry.keyHash(big))
    assert(t.heapBytes - before == big.length)
    val a = t.find(Key(keyBytes(1)))
    assert(t.offsetOf(a) == 0 && java.util.Arrays.equals(t.copyOf(a), big))
    t.remove(Key(keyBytes(1)))
    assert(t.heapBytes == before && contents(t) == Map(2 -> 2L))
    t.checkAccounts()
  }

  /** A table of keys 0 to 9 (each its own value), with key 3, the slot it is in and its entry's address. */
  private def tenKeys(): (EntryTable, Key, Int, Long) = {
    val t = new EntryTable()
    for (k <- 0 until 10) t.put(entry(k, k), Entry.keyHash(entry(k, k)))
    val key3 = Key(keyBytes(3))
    val slot = t.slotOf(key3)
    val found = t.addressAt(slot)
    assert(slot >= 0 && valueAt(t, found) == 3)
    (t, key3, slot, found)
  }

  test("replaceAt updates the slot slotOf found, and refuses once a resize or a removal moved the key") {
    val (t, key3, slot, found) = tenKeys()
    assert(t.slotOf(Key(keyBytes(99))) == -1)
    val stamp = t.stamp
    // Same arrays, and the slot still holds the entry found there: the new entry takes its place.
    val e33 = entry(3, 33)
    assert(t.replaceAt(slot, stamp, found, e33))
    assert(contents(t) == (0 until 10).map(k => k -> (if (k == 3) 33L else k.toLong)).toMap)
    // The slot no longer holds `found`: refused, nothing changes.
    assert(!t.replaceAt(slot, stamp, found, entry(3, 34)))
    assert(valueAt(t, t.find(key3)) == 33)
    // Removed: the slot holds the Deleted marker, and replaceAt changes nothing.
    val at33 = t.find(key3)
    t.remove(key3)
    assert(!t.replaceAt(slot, stamp, at33, entry(3, 333)))
    assert(!t.replaceAt(slot, stamp, EntryTable.NoEntry, entry(3, 333)))
    assert(t.find(key3) == EntryTable.NoEntry && t.size == 9)
    // A resize gives new arrays and a new stamp: the old slot numbers mean nothing, and are refused.
    val key5 = Key(keyBytes(5))
    val slot5 = t.slotOf(key5)
    val found5 = t.addressAt(slot5)
    val before = t.stamp
    for (k <- 100 until 10000) t.put(entry(k, k), Entry.keyHash(entry(k, k)))
    assert(t.stamp != before)
    assert(!t.replaceAt(slot5, before, found5, entry(5, 55)))
    assert(valueAt(t, t.find(key5)) == 5)
    val now = t.slotOf(key5)
    val e55 = entry(5, 55)
    assert(t.replaceAt(now, t.stamp, found5, e55))
    assert(valueAt(t, t.find(key5)) == 55 && t.size == 9 + 9900)
    t.checkAccounts()
    // A clear is a new set of arrays too.
    val cleared = t.stamp
    val at55 = t.find(key5)
    t.clear()
    assert(t.stamp != cleared && !t.replaceAt(now, cleared, at55, entry(5, 555)) && t.size == 0)
  }

  test("overwriteAt writes a value of the same length over the old one, and refuses any other") {
    val (t, key3, slot, found) = tenKeys()
    val (held, garbage, live) = (t.heapBytes, t.garbageBytes, t.entryBytes)
    assert(entry(3, 33).length == entry(3, 3).length)
    assert(t.overwriteAt(slot, t.stamp, found, entry(3, 33)))
    // The same address now holds the new value: nothing appended, no garbage.
    assert(t.find(key3) == found && valueAt(t, found) == 33)
    assert(t.heapBytes == held && t.garbageBytes == garbage && t.entryBytes == live)
    assert(contents(t) == (0 until 10).map(k => k -> (if (k == 3) 33L else k.toLong)).toMap)
    t.checkAccounts()
    // A value of another length: refused, nothing changes.
    assert(entry(3, 34).length != entry(3, 33).length && !t.overwriteAt(slot, t.stamp, found, entry(3, 34)))
    assert(valueAt(t, t.find(key3)) == 33)
    // An address the slot does not hold, no address, a slot out of range, a stale stamp: refused.
    val at4 = t.find(Key(keyBytes(4)))
    assert(!t.overwriteAt(slot, t.stamp, at4, entry(3, 36)))
    assert(!t.overwriteAt(slot, t.stamp, EntryTable.NoEntry, entry(3, 36)))
    assert(!t.overwriteAt(-1, t.stamp, found, entry(3, 36)) && !t.overwriteAt(t.capacity, t.stamp, found, entry(3, 36)))
    val stamp = t.stamp
    for (k <- 100 until 10000) t.put(entry(k, k), Entry.keyHash(entry(k, k)))
    assert(t.stamp != stamp && !t.overwriteAt(slot, stamp, found, entry(3, 36)))
    // Removed: the slot holds the Deleted marker.
    val now = t.slotOf(key3)
    val at33 = t.addressAt(now)
    t.remove(key3)
    assert(!t.overwriteAt(now, t.stamp, at33, entry(3, 36)) && t.find(key3) == EntryTable.NoEntry)
    assert(contents(t) == ((0 until 10).filter(_ != 3) ++ (100 until 10000)).map(k => k -> k.toLong).toMap)
    t.checkAccounts()
  }

  /** An entry whose value is always 8 bytes long, whatever `v`. */
  private def fixedEntry(k: Int, v: Long): Array[Byte] = {
    val value = new Array[Byte](8)
    Platform.putLong(value, Platform.BYTE_ARRAY_OFFSET, v)
    Entry(keyBytes(k), value)
  }

  test("a change set on an empty state moves puts to pages; look-ups, removals and the commit see them") {
    val live = new LiveState(None, 0)
    val changes = new ChangeSet(live, pagesFrom = 8)
    var model = Map.empty[Int, Long]
    def put(k: Int, v: Long): Unit = { changes.put(Key(keyBytes(k)), fixedEntry(k, v)); model += k -> v }
    for (k <- 0 until 100) put(k, k * 10L)
    assert(changes.pagedPuts != null && changes.pagedPuts.size >= 90, "puts past the 8th moved to pages")
    for (k <- 10 until 20) { changes.remove(Key(keyBytes(k))); model -= k } // paged keys, removed
    put(15, -15L) // a removed key put back
    put(3, 333L) // a paged key updated
    for (k <- 0 until 105) {
      val found = changes.lookup(Key(keyBytes(k)))
      assert(Option(found).map(valueOf) == model.get(k), s"look-up of $k")
    }
    assert(changes.size == model.size && changes.keyDelta == model.size)
    val seen = mutable.Map.empty[Int, Long]
    changes.foreach { (key, entry) =>
      assert(!seen.contains(keyOf(entry, 0)), s"key ${keyOf(entry, 0)} given twice")
      assert(key.bytes.sameElements(Entry.key(entry)))
      seen(keyOf(entry, 0)) = valueOf(entry)
    }
    assert(seen.toMap == model)
    val prepared = live.prepareCommit(changes)
    assert(prepared.keyDelta == model.size)
    live.applyCommit(prepared, 0, inPlace = true)
    assert(live.iterator.map { a =>
      val p = live.pageOf(a); val at = live.offsetOf(a); keyOf(p, at) -> valueOf(p, at)
    }.toMap == model)
    assert(live.memoryBytes == live.memoryBytesRecounted)
    // On a state that is not empty, the puts stay in the map.
    val next = new ChangeSet(live, pagesFrom = 8)
    for (k <- 200 until 300) next.put(Key(keyBytes(k)), fixedEntry(k, k))
    assert(next.pagedPuts == null && next.size == 100)
  }

  test("commits that write same-length updates in place leave no garbage and keep state and memory count exact") {
    val rnd = new scala.util.Random(9)
    val live = new LiveState(None, 0)
    var model = Map.empty[Int, Long]
    val first = new ChangeSet(live)
    for (k <- 0 until 20000) { first.put(Key(keyBytes(k)), fixedEntry(k, k)); model += k -> k.toLong }
    live.applyCommit(live.prepareCommit(first), 0, inPlace = true)
    var updated = 0L
    var previous = Seq.empty[Int]
    for (v <- 2 to 60) {
      val changes = new ChangeSet(live)
      // Every fifth version starts three commits made as if a snapshot were being written: their
      // updates are appended. Those commits update some keys again, as the next one does.
      val inPlace = v % 5 > 2 || v < 5
      // Few enough that compaction never runs (under 16 KiB of garbage): only fillHoles tidies up.
      val keys = Seq.fill(100)(rnd.nextInt(20000)) ++ previous.take(20)
      for (k <- keys) {
        val value = rnd.nextLong()
        changes.put(Key(keyBytes(k)), fixedEntry(k, value)); model += k -> value
      }
      previous = if (inPlace) Nil else keys
      if (inPlace) updated += changes.size
      live.applyCommit(live.prepareCommit(changes), v - 3L, inPlace)
      assert(live.memoryBytes == live.memoryBytesRecounted, s"version $v: the running memory count")
      // Updates appended meanwhile (keys updated twice among them) went back over their old entries.
      if (inPlace) assert(live.garbageBytes == 0, s"version $v: an update left its old entry behind")
      else assert(live.garbageBytes > 0, s"version $v: appended updates leave their old entries behind")
    }
    assert(live.iterator.map { a =>
      val p = live.pageOf(a); val at = live.offsetOf(a); keyOf(p, at) -> valueOf(p, at)
    }.toMap == model)
    assert(live.writtenInPlace == updated && live.movedBackBytes > 0 && live.compactedBytes == 0)
  }

  test("fillHoles moves same-length appends back over their old entries: removed, re-updated and resized keys too") {
    val rnd = new scala.util.Random(21)
    val t = new EntryTable()
    var model = Map.empty[Int, Long]
    for (k <- 0 until 20000) { val e = fixedEntry(k, k); t.put(e, Entry.keyHash(e)); model += k -> k.toLong }
    def update(k: Int, e: Array[Byte]): Unit = {
      val slot = t.slotOf(Key(keyBytes(k)))
      assert(t.replaceAt(slot, t.stamp, t.addressAt(slot), e))
    }
    def check(what: String): Unit = {
      assert(contents(t) == model, what)
      t.checkAccounts()
      assert(t.heapBytes == t.heapBytesRecounted, what)
    }
    // Distinct updates of the same lengths, some keys twice, over several hole pages: all go
    // back, and no garbage stays.
    val entryBytes = t.entryBytes
    for (_ <- 0 until 8000) {
      val k = rnd.nextInt(20000); val v = rnd.nextLong(); update(k, fixedEntry(k, v)); model += k -> v
    }
    assert(t.garbageBytes > 0 && t.holes == 8000)
    val held = t.heapBytes
    assert(t.fillHoles() > 0)
    check("after the first fill")
    assert(t.garbageBytes == 0 && t.entryBytes == entryBytes, s"${t.garbageBytes} bytes of garbage stayed")
    assert(t.heapBytes < held, "the pages appended to were not dropped")
    // Holes whose key was removed since or updated with another length since stay garbage, and so
    // do their keys' copies; the others go back.
    val updates = Seq.fill(3000)(rnd.nextInt(20000)) // a key may come twice or more
    for (k <- updates) { val v = rnd.nextLong(); update(k, fixedEntry(k, v)); model += k -> v }
    val distinct = updates.distinct
    val removed = distinct.take(300).toSet
    val resized = distinct.slice(300, 500).toSet
    removed.foreach { k => t.remove(Key(keyBytes(k))); model -= k }
    resized.foreach { k => update(k, entry(k, 1L)); model += k -> 1L }
    val garbage = t.garbageBytes
    val moved = t.fillHoles()
    check("after fills skipped removed and re-sized keys")
    // Each update of a key still there with its length went back, one move per update (a key
    // updated twice goes back twice); the pages appended to emptied; what stays garbage is the
    // first place of each removed or re-sized key.
    def length(k: Int): Long = fixedEntry(k, 0).length.toLong
    val back = updates.filterNot(k => removed(k) || resized(k)).map(length).sum
    assert(moved == back, s"moved $moved bytes, not the $back of the updates that could go back")
    val left = (removed ++ resized).toSeq.map(length).sum
    assert(t.garbageBytes == left && left < garbage, s"${t.garbageBytes} bytes of garbage, not $left")
    // A hole whose page compaction emptied is skipped: its entry stays where it was appended.
    for (_ <- 0 until 3000) {
      val k = rnd.nextInt(20000)
      if (model.contains(k)) { val v = rnd.nextLong(); update(k, fixedEntry(k, v)); model += k -> v }
    }
    assert(t.compact() > 0, "compaction moved nothing")
    t.fillHoles()
    check("after a fill that followed compaction")
    // A resize in between: no slot number holds, and nothing moves.
    for (_ <- 0 until 500) {
      val k = rnd.nextInt(20000);
      if (model.contains(k)) { val v = rnd.nextLong(); update(k, fixedEntry(k, v)); model += k -> v }
    }
    val garbageBeforeResize = t.garbageBytes
    for (k <- 100000 until 140000) { val e = fixedEntry(k, k); t.put(e, Entry.keyHash(e)); model += k -> k.toLong }
    assert(t.fillHoles() == 0 && t.garbageBytes == garbageBeforeResize)
    check("after a resize")
  }

  test("reserve makes room for that many more keys at once: the puts that follow never resize") {
    val t = new EntryTable()
    for (k <- 0 until 100) t.put(entry(k, k), Entry.keyHash(entry(k, k)))
    val kb = keyBytes(7)
    t.remove(kb, Platform.BYTE_ARRAY_OFFSET, kb.length, Key(kb).hashCode) // a Deleted marker the rehash drops
    val before = t.stamp
    t.reserve(50000)
    // The capacity puts up to 50,099 keys grow the table to, and no more.
    assert(t.stamp == before + 1 && t.capacity == 131072)
    val (stamp, capacity) = (t.stamp, t.capacity)
    for (k <- 100 until 50099) t.put(entry(k, k * 3L), Entry.keyHash(entry(k, k * 3L)))
    assert(t.stamp == stamp && t.capacity == capacity, "a put resized the table after reserve")
    t.reserve(1) // room enough already: nothing moves
    assert(t.stamp == stamp)
    // Never more room than the puts would have made: 131,072 slots take 98,304 keys before a put
    // resizes (at three quarters full, see put), and one key more doubles them.
    t.reserve(98304 - 50098)
    assert(t.stamp == stamp && t.capacity == 131072)
    t.reserve(98305 - 50098)
    assert(t.stamp == stamp + 1 && t.capacity == 262144)
    assert(contents(t) == ((0 until 100).filter(_ != 7).map(k => k -> k.toLong) ++ (100 until 50099).map(k =>
      k -> k * 3L)).toMap)
    t.checkAccounts()
  }

  test("commits update keys in the slots they were found in: state and memory count exact, through resizes") {
    val rnd = new scala.util.Random(5)
    val live = new LiveState(None, 0)
    var model = Map.empty[Int, Array[Byte]]
    for (v <- 1 to 80) {
      val changes = new ChangeSet(live)
      // Early versions add many keys (the table resizes inside commits), later ones churn a few
      // hundred; values change length, so a replaced entry changes the memory count.
      for (_ <- 0 until (if (v < 20) 2000 else 1 + rnd.nextInt(300))) {
        val k = rnd.nextInt(if (v < 20) 40000 else 500)
        if (rnd.nextInt(6) == 0) { changes.remove(Key(keyBytes(k))); model -= k }
        else {
          val value = Array.fill(8 + rnd.nextInt(60))(rnd.nextInt().toByte)
          val e = Entry(keyBytes(k), value)
          changes.put(Key(keyBytes(k)), e); model += k -> e
        }
      }
      live.applyCommit(live.prepareCommit(changes), v - 3L, inPlace = false)
      assert(live.memoryBytes == live.memoryBytesRecounted, s"version $v: the running memory count")
      assert(live.numKeys == model.size, s"version $v")
      for (k <- 0 until 40000 by 7) {
        val got = live.get(Key(keyBytes(k)))
        val bytes = if (got == EntryTable.NoEntry) None
        else {
          val page = live.pageOf(got); val at = live.offsetOf(got)
          Some(page.slice(at, at + Entry.length(page, at)).toSeq)
        }
        assert(bytes == model.get(k).map(_.toSeq), s"version $v, key $k")
      }
    }
    assert(live.compactedBytes > 0, "the churn left enough garbage for compaction to move entries")
  }

  for (inPlace <- Seq(false, true)) test("undo entries: a snapshot view of every kept version and a roll-back to it " +
    s"equal the model (updates ${if (inPlace) "written in place" else "appended"})") {
    val rnd = new scala.util.Random(11)
    val keep = 6
    val live = new LiveState(None, 0)
    // Sets of about half the buckets of a split, for views of some buckets alone.
    val pick = new scala.util.Random(13)
    def someBuckets(bits: Int): BucketSet =
      new BucketSet(bits, Array.fill(math.max(1, (1 << bits) >>> 6))(pick.nextLong()))
    // The model of every version: key -> value. Version 0 is empty, so version 1 is a FromEmpty.
    val models = mutable.ArrayBuffer(Map.empty[Int, Long])
    def liveContents(st: LiveState): Map[Int, Long] = {
      val out = mutable.ArrayBuffer.empty[Array[Byte]]
      st.iterator.foreach { a =>
        val page = st.pageOf(a); val at = st.offsetOf(a); out += page.slice(at, at + Entry.length(page, at))
      }
      assert(out.size == st.numKeys)
      contentsOf(out)
    }
    def contentsOf(emitted: mutable.ArrayBuffer[Array[Byte]]): Map[Int, Long] = {
      val out = mutable.Map.empty[Int, Long]
      emitted.foreach { e =>
        val k = keyOf(e, 0)
        // A view may emit a key twice, always with its value at the view's version.
        assert(out.get(k).forall(_ == valueOf(e)), s"key $k emitted with two values")
        out(k) = valueOf(e)
      }
      out.toMap
    }
    def commit(v: Int): Unit = {
      val changes = new ChangeSet(live)
      var model = models.last
      for (_ <- 0 until 1 + rnd.nextInt(if (v == 1) 400 else 60)) {
        val k = rnd.nextInt(300) // removes of absent keys, re-inserts and updates all happen
        if (rnd.nextInt(4) == 0) { changes.remove(Key(keyBytes(k))); model -= k }
        else {
          val value = rnd.nextLong()
          changes.put(Key(keyBytes(k)), entry(k, value)); model += k -> value
        }
      }
      live.applyCommit(live.prepareCommit(changes), v.toLong - keep, inPlace)
      models += model
    }
    for (v <- 1 to 40) {
      commit(v)
      assert(live.memoryBytes == live.memoryBytesRecounted, s"version $v: the running memory count")
      for (s <- math.max(0, v - keep) to v) {
        val emitted = mutable.ArrayBuffer.empty[Array[Byte]]
        live.writeSnapshotView(s,
          (b, at, hash) => {
            assert(hash == Entry.keyHash(b, at))
            emitted += b.slice(at, at + Entry.length(b, at))
          })
        assert(contentsOf(emitted) == models(s), s"the view of version $s at version $v")
        // Of some buckets alone: the keys of those buckets, from the table and the undo log alike.
        val only = someBuckets(pick.nextInt(StateFileFormat.MaxBucketBits + 1))
        val some = mutable.ArrayBuffer.empty[Array[Byte]]
        live.writeSnapshotView(s,
          (b, at, hash) => {
            assert(hash == Entry.keyHash(b, at))
            some += b.slice(at, at + Entry.length(b, at))
          },
          only)
        val inThem = models(s).filter { case (k, _) => only.containsHash(Key(keyBytes(k)).hashCode) }
        assert(contentsOf(some) == inThem, s"the view of version $s at version $v, of ${only.bits} bucket bits")
      }
      assert(!live.canRollBackTo(v - keep - 1L), s"version $v keeps no more than $keep undo entries")
      if (v % 7 == 0 || v == 5) {
        // Step back and commit forward again from there (a task retry); from 5 to the empty
        // version 0, through version 1's FromEmpty.
        val target = if (v == 5) 0 else v - 1 - rnd.nextInt(keep)
        assert(live.canRollBackTo(target), s"version $v: roll back to $target")
        live.rollBackTo(target)
        assert(liveContents(live) == models(target), s"rolled back from $v to $target")
        assert(live.numKeys == models(target).size && live.memoryBytes == live.memoryBytesRecounted)
        models.remove(target + 1, v - target)
        (target + 1 to v).foreach(commit)
        assert(liveContents(live) == models(v), s"version $v committed again after the roll-back")
      }
    }
    // A third of the updates keep their value's length: some are written in place exactly when asked.
    assert((live.writtenInPlace > 0) == inPlace, s"${live.writtenInPlace} updates written in place")
  }

  test("a snapshot view after a roll-back sees the version committed again while it runs") {
    // A roll-back leaves the live state's note of its newest undo version (`undoTop`) as it was,
    // so committing that version again writes the same number once more; the view must still see
    // the new commit's undo entry.
    val live = new LiveState(None, 0)
    def commit(kv: Seq[(Int, Long)]): Unit = {
      val changes = new ChangeSet(live)
      kv.foreach { case (k, v) => changes.put(Key(keyBytes(k)), entry(k, v)) }
      live.applyCommit(live.prepareCommit(changes), 0, inPlace = false) // as while a snapshot is written
    }
    commit((0 until 200).map(k => k -> k.toLong)) // version 1
    commit((0 until 200 by 2).map(k => k -> -k.toLong)) // version 2
    live.rollBackTo(1)
    val atOne = (0 until 200).map(k => k -> k.toLong).toMap
    val emitted = mutable.ArrayBuffer.empty[Array[Byte]]
    var recommitted = false
    live.writeSnapshotView(
      1,
      (b, at, _) => {
        emitted += b.slice(at, at + Entry.length(b, at))
        if (!recommitted) { // version 2 again, after the view has read its first entry
          recommitted = true
          commit((0 until 200).map(k => k -> (1000L + k)) ++ (200 until 300).map(k => k -> k.toLong))
        }
      }
    )
    val seen = mutable.Map.empty[Int, Long]
    emitted.foreach { e =>
      val k = keyOf(e, 0)
      assert(seen.get(k).forall(_ == valueOf(e)), s"key $k emitted with ${seen.get(k)} and ${valueOf(e)}")
      seen(k) = valueOf(e)
    }
    assert(seen.toMap == atOne)
  }

  test("a key removed and put back while an iterator runs is not seen twice, also where its chain wraps around") {
    val t = new EntryTable() // 32 slots
    val hash = t.capacity - 2 // a chain of keys hashing here runs through the last two slots into 0, 1, ...
    val ks = (1 to 4).map(k => entry(k, k.toLong))
    ks.foreach(e => t.put(e, hash)) // slots 30, 31, 0, 1
    val it = t.iterator
    val seen = mutable.ArrayBuffer(keyAt(t, it.next()), keyAt(t, it.next())) // slots 0 and 1: keys 3 and 4
    assert(seen == Seq(3, 4))
    val k2 = Entry.key(ks(1)); val k4 = Entry.key(ks(3))
    t.remove(k2, Platform.BYTE_ARRAY_OFFSET, k2.length, hash) // slot 31 is free
    t.remove(k4, Platform.BYTE_ARRAY_OFFSET, k4.length, hash) // slot 1 is free
    t.put(entry(4, 40), hash) // first in the chain is 31, lowest is 1
    it.foreach(a => seen += keyAt(t, a))
    assert(seen.sorted == Seq(1, 3, 4), s"seen: $seen")
    assert(contents(t) == Map(1 -> 1L, 3 -> 3L, 4 -> 40L))
  }

  test("a key removed and put back beside an iterator is met once, though another key took its chain meanwhile") {
    // The interleaving stop 40's CI caught: the iterator passes key 1 in its slot; the writer
    // removes key 1, puts key 2 (same chain), then puts key 1 back. Had key 2 taken key 1's old
    // slot, key 1 would land in the next one, ahead of the iterator, and be met twice.
    val t = new EntryTable() // 32 slots
    val hash = 5
    t.put(entry(1, 1L), hash) // slot 5
    val k1 = Entry.key(entry(1, 1L))
    val seen = mutable.ArrayBuffer.empty[(Int, Long)]
    t.foreach { (b, at) =>
      seen += keyOf(b, at) -> valueOf(b, at)
      if (seen.size == 1) { // the writer's changes, made while this reader is registered
        assert(t.remove(k1, Platform.BYTE_ARRAY_OFFSET, k1.length, hash) > 0)
        assert(t.put(entry(2, 2L), hash) == -1)
        assert(t.put(entry(1, 10L), hash) == -1)
        assert(t.compact() == 0 && t.vacatedSlots == 1, "a vacated slot settled while a reader was registered")
      }
    }
    assert(seen == Seq(1 -> 1L, 2 -> 2L))
    assert(contents(t) == Map(1 -> 10L, 2 -> 2L))
    t.checkAccounts()
    t.compact() // no reader now: the list of vacated slots is settled
    assert(t.vacatedSlots == 0)
    // With no reader, the removed slot settles after a commit's compact() and any key may take it.
    assert(t.remove(k1, Platform.BYTE_ARRAY_OFFSET, k1.length, hash) > 0 && t.vacatedSlots == 1)
    t.compact()
    assert(t.vacatedSlots == 0)
    assert(t.put(entry(3, 3L), hash) == -1) // takes slot 5, ahead of key 2 in slot 6
    val order = mutable.ArrayBuffer.empty[Int]
    t.foreach((b, at) => order += keyOf(b, at))
    assert(order == Seq(3, 2))
    t.checkAccounts()
  }

  test(
    "iterators beside a writer that removes a key, lets another key of its chain in and puts it back meet each key once") {
    // The interleaving of the test above, made often: the writer removes a key, puts a key that
    // hashes to the same slot (its intruder), puts the first key back, removes the intruder, and
    // removes and puts the first key once more, over and over, while readers iterate. 500 keys in 1,024 slots, never more than 501: a resize
    // rehashes into as many slots, and the intruders keep colliding.
    val t = new EntryTable(512)
    val capacity = t.capacity
    val mask = capacity - 1
    def home(k: Int) = Entry.keyHash(entry(k, 0L)) & mask
    val movers = 0 until 100
    val stable = 100 until 500
    val intruder = {
      val candidates = Iterator.from(1000000)
      movers.map(k => candidates.find(c => home(c) == home(k)).get).toArray
    }
    (movers ++ stable).foreach { k =>
      val e = entry(k, k.toLong); t.put(e, Entry.keyHash(e))
    }
    val stop = new AtomicBoolean(false)
    val cycles = new java.util.concurrent.atomic.AtomicLong
    val writer = new Thread(() => {
      val rnd = new scala.util.Random(5)
      def put(k: Int): Unit = { val e = entry(k, k.toLong); t.put(e, Entry.keyHash(e)) }
      def remove(k: Int): Unit = {
        val kb = keyBytes(k); t.remove(kb, Platform.BYTE_ARRAY_OFFSET, kb.length, Key(kb).hashCode)
      }
      while (!stop.get()) {
        val m = rnd.nextInt(movers.size)
        remove(movers(m)); put(intruder(m)); put(movers(m)); remove(intruder(m))
        remove(movers(m));
        put(movers(m)) // back to the lowest slot it may take, so that the next cycle can move it again
        if (cycles.incrementAndGet() % 64 == 0) t.compact() // settles the vacated slots when no reader is registered
      }
    })
    writer.start()
    try {
      for (_ <- 0 until 20000) iterateBeside(t, stable, _.toLong)
    } finally { stop.set(true); writer.join() }
    assert(cycles.get > 10000, s"the writer ran ${cycles.get} cycles only")
    assert(t.capacity == capacity)
    t.checkAccounts()
  }

  test(
    "an iterator running beside the writer sees each key once, with a value it had, while compaction moves entries") {
    val t = new EntryTable()
    val stable = 0 until 20000 // never changed while iterating: must all be seen, unchanged
    // Each stable key shares its page with changing keys, so compaction moves stable keys too.
    stable.foreach { k =>
      val e = entry(k, k.toLong); t.put(e, Entry.keyHash(e))
      val c = entry(20000 + k, -(20000L + k)); t.put(c, Entry.keyHash(c))
    }
    val stop = new AtomicBoolean(false)
    val moved = new java.util.concurrent.atomic.AtomicLong
    val writer = new Thread(() => {
      val rnd = new scala.util.Random(3)
      var i = 0
      while (!stop.get()) {
        val k = 20000 + rnd.nextInt(100000) // inserts force resizes while the reader runs
        if (rnd.nextBoolean()) { val e = entry(k, -k.toLong); t.put(e, Entry.keyHash(e)) }
        else { val kb = keyBytes(k); t.remove(kb, Platform.BYTE_ARRAY_OFFSET, kb.length, Key(kb).hashCode) }
        i += 1
        if (i % 500 == 0) moved.addAndGet(t.compact())
      }
    })
    writer.start()
    try {
      for (_ <- 0 until 60) iterateBeside(t, stable, k => if (k < 20000) k.toLong else -k.toLong)
    } finally { stop.set(true); writer.join() }
    assert(moved.get > 0, "compaction moved no entry while the reader ran")
    t.checkAccounts()
    assert(t.heapBytes == t.heapBytesRecounted)
  }
}
