package heapstate.bench

import heapstate.bench.BenchStores._

import java.io.File
import java.nio.file.Files

import scala.collection.mutable

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.unsafe.Platform

import heapstate.engine.{ChangeSet, Entry, EntryTable, Key, KeyProbe, LiveState}

/**
 * Where W3's random get (K `long` keys with `long` values, loaded as version 1) spends its time,
 * in one JVM, the ways taking turns run by run, each run 200,000 gets of keys drawn at random
 * (with repeats, below 200,000 keys), each figure the median of the runs after `--warmups`:
 *   - `store.get`: through one provider's `StateStore.get`, reading the value it returns, as W3
 *     does; and the same without reading the value;
 *   - for heapstate, through its live state alone: the table's look-up, then the value read from
 *     its page, written in the timed loop (`live.get`) and as a method of its own that the JIT
 *     is told not to inline (`live.get, called`, only when the JVM runs with
 *     `-XX:CompileCommand=dontinline,heapstate.bench.GetPath$::liveGet`, as below);
 *   - `a new row, called`: the store's get as it was before stop 68, allocating a row for each
 *     value, as a method the JIT does not inline (with `dontinline` of `GetPath$::newRowGet`).
 *
 * Stop 67 (K = 1M, the AMD EPYC machine): `store.get` 2,900 a ms, `live.get` 5,300 and
 * `live.get, called` 4,800; the cause was not found then. Stop 68 found three, and the store's get
 * now runs at 4,900 to 5,000 with the value read:
 *   - the JIT inlined neither the table's key comparison nor the `pending` check into the
 *     look-up, so each made two calls (`live.get` 4,900, 5,400 without them);
 *   - the get is compiled on its own, so the row it returned escaped and was allocated for every
 *     get: `a new row, called` 3,000 a ms against `live.get, called` 5,350 in one JVM;
 *   - with one reused row, the store's path still ran at 2,900 with the value read (4,100 without):
 *     it looked the entry up, then found its page again and read its header to point the row,
 *     and read the change set's size through three objects. One step that points the row where
 *     the look-up ends (`LiveState.pointToValue`) and a flag for "no changes yet" brought it to
 *     4,900 to 5,000. Each load counts: successive gets overlap their cache misses only while
 *     their loads fit the processor's queues (an inference; this VM has no hardware counters).
 * See docs/PERFORMANCE_HISTORY.md, stop 68.
 *
 * {{{
 *   bin/sbt "set bench / fork := true" \
 *     "set bench / run / javaOptions ++= Seq(\"-XX:CompileCommand=dontinline,heapstate.bench.GetPath\$::liveGet\", \"-XX:CompileCommand=dontinline,heapstate.bench.GetPath\$::newRowGet\")" \
 *     "bench/runMain heapstate.bench.GetPath --providers heapstate --keys 1000000"
 *   bin/sbt "bench/runMain heapstate.bench.GetPath --providers hdfs --keys 10000 --runs 30"
 * }}}
 */
object GetPath {
  private val CF = StateStore.DEFAULT_COL_FAMILY_NAME
  @volatile private var live: LiveState = _

  /** The value of `key` in [[live]], read from its page: the live path of `live.get, called`. */
  def liveGet(key: UnsafeRow): Long = {
    val st = live
    val hash = Key.hash(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes)
    val address = st.get(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes, hash)
    val page = st.pageOf(address)
    Platform.getLong(page, Platform.BYTE_ARRAY_OFFSET + Entry.valueStart(page, st.offsetOf(address)) + 8)
  }

  @volatile private var changeSet: ChangeSet = _

  /**
   * The store's get as it was before stop 68, a new row for each value, on [[live]] with an empty
   * [[changeSet]]: the path of `a new row, called`.
   */
  def newRowGet(key: UnsafeRow): UnsafeRow = {
    val st = live
    val changes = changeSet
    val probe = new KeyProbe(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes)
    val changed = if (changes.isEmpty) null else changes.lookup(probe)
    if (changed != null) null
    else {
      val address = st.get(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes, probe.hashCode)
      if (address == EntryTable.NoEntry) null
      else {
        val page = st.pageOf(address)
        val at = st.offsetOf(address)
        val r = new UnsafeRow(1)
        r.pointTo(page, Platform.BYTE_ARRAY_OFFSET + Entry.valueStart(page, at), Entry.valueLength(page, at))
        r
      }
    }
  }

  def main(args: Array[String]): Unit = {
    val opts = options(args)
    val p = chosen(opts).head
    val keys = opts.getOrElse("keys", "1000000").toInt
    val runs = opts.getOrElse("runs", "20").toInt
    val warmups = opts.getOrElse("warmups", "8").toInt
    require(warmups >= 0 && runs > warmups, s"--runs ($runs) must be above --warmups ($warmups)")
    val ops = 200000
    def notInlined(method: String) = java.lang.management.ManagementFactory.getRuntimeMXBean.getInputArguments
      .stream().anyMatch(a => a.startsWith("-XX:CompileCommand=dontinline") && a.endsWith(s"GetPath$$::$method"))
    val noInline = notInlined("liveGet")
    val newRowNoInline = notInlined("newRowGet")
    val spark = SparkSession.builder().master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.streams // the coordinator HDFS reports to, as in W3
    val root = Files.createTempDirectory(s"getpath-${p.name}").toString
    val provider = open(p, root)
    val key = longRow()
    val value = longRow()
    val load = provider.getStore(0)
    var i = 0
    while (i < keys) { key.setLong(0, i); value.setLong(0, i); load.put(key, value, CF); i += 1 }
    load.commit()
    val rnd = new scala.util.Random(42)
    val existing = Array.fill(ops)(rnd.nextInt(keys).toLong)
    var sink = 0L
    def rate(body: => Unit): Double = { val t = System.nanoTime(); body; ops / ((System.nanoTime() - t) / 1e6) }
    def viaStore(readValue: Boolean)(): Double = {
      val s = provider.getStore(1)
      val r = rate {
        var j = 0
        while (j < ops) {
          key.setLong(0, existing(j))
          val v = s.get(key, CF)
          if (v != null) sink += (if (readValue) v.getLong(0) else 1L)
          j += 1
        }
      }
      s.abort()
      r
    }
    live = provider match {
      case h: heapstate.HeapStateStoreProvider => h.liveAt(1)
      case _ => null
    }
    def viaLive(): Double = rate {
      val st = live
      var j = 0
      while (j < ops) {
        key.setLong(0, existing(j))
        val hash = Key.hash(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes)
        val address = st.get(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes, hash)
        val page = st.pageOf(address)
        sink += Platform.getLong(page, Platform.BYTE_ARRAY_OFFSET + Entry.valueStart(page, st.offsetOf(address)) + 8)
        j += 1
      }
    }
    def viaLiveCalled(): Double = rate {
      var j = 0
      while (j < ops) { key.setLong(0, existing(j)); sink += liveGet(key); j += 1 }
    }
    // The empty change set that `newRowGet` checks, as the store's get did.
    if (live != null) changeSet = new ChangeSet(live)
    def viaNewRowCalled(): Double = rate {
      var j = 0
      while (j < ops) {
        key.setLong(0, existing(j)); val v = newRowGet(key); if (v != null) sink += v.getLong(0); j += 1
      }
    }
    val ways: Seq[(String, () => Double)] =
      Seq("store.get" -> viaStore(readValue = true) _, "store.get, value not read" -> viaStore(readValue = false) _) ++
        (if (live == null) Nil else Seq("live.get" -> (() => viaLive()))) ++
        (if (live == null || !noInline) Nil else Seq("live.get, called" -> (() => viaLiveCalled()))) ++
        (if (live == null || !newRowNoInline) Nil else Seq("a new row, called" -> (() => viaNewRowCalled())))
    val rates = ways.map(_._1 -> mutable.ArrayBuffer.empty[Double]).toMap
    for (_ <- 0 until runs; (name, way) <- ways) rates(name) += way()
    for ((name, _) <- ways) {
      val measured = rates(name).drop(warmups).sorted
      println(f"[getpath] ${p.name} $name: median ${measured(measured.size / 2)}%.0f gets/ms " +
        s"(runs ${rates(name).map(r => f"$r%.0f").mkString(" ")})")
    }
    if (sink == 42) println("") // keeps `sink` alive
    provider.close()
    spark.stop()
    deleteRecursively(new File(root))
  }
}
