package heapstate.bench

import heapstate.bench.BenchStores._

import java.io.File
import java.nio.file.Files

import scala.collection.mutable

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.unsafe.Platform

import heapstate.engine.{Entry, Key, LiveState}

/**
 * Where W3's random get (K `long` keys with `long` values, loaded as version 1) spends its time,
 * in one JVM, the ways taking turns run by run, each run 200,000 gets of keys drawn at random
 * (with repeats, below 200,000 keys), each figure the median of the runs after `--warmups`:
 *   - `store.get`: through one provider's `StateStore.get`, reading the value it returns, as W3
 *     does; and the same without reading the value;
 *   - for heapstate, through its live state alone: the table's look-up, then the value read from
 *     its page, written in the timed loop (`live.get`) and as a method of its own that the JIT
 *     is told not to inline (`live.get, called`, only when the JVM runs with
 *     `-XX:CompileCommand=dontinline,heapstate.bench.GetPath$::liveGet`, as below).
 *
 * Stop 67 (K = 1M, the AMD EPYC machine): `store.get` 2,900 a ms, `live.get` 5,300 and
 * `live.get, called` 4,800; at K = 10,000, 14,000 against 22,000. The look-up's two cache misses
 * are the same in each, and the time the store path adds grows with the misses: consistent with
 * the misses of successive gets overlapping less, not shown. See README, "Where heapstate loses
 * today".
 *
 * {{{
 *   bin/sbt "set bench / fork := true" \
 *     "set bench / run / javaOptions += \"-XX:CompileCommand=dontinline,heapstate.bench.GetPath\$::liveGet\"" \
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

  def main(args: Array[String]): Unit = {
    val opts = options(args)
    val p = chosen(opts).head
    val keys = opts.getOrElse("keys", "1000000").toInt
    val runs = opts.getOrElse("runs", "20").toInt
    val warmups = opts.getOrElse("warmups", "8").toInt
    require(warmups >= 0 && runs > warmups, s"--runs ($runs) must be above --warmups ($warmups)")
    val ops = 200000
    val noInline = java.lang.management.ManagementFactory.getRuntimeMXBean.getInputArguments
      .stream().anyMatch(a => a.startsWith("-XX:CompileCommand=dontinline") && a.endsWith("GetPath$::liveGet"))
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
    val ways: Seq[(String, () => Double)] =
      Seq("store.get" -> viaStore(readValue = true) _, "store.get, value not read" -> viaStore(readValue = false) _) ++
        (if (live == null) Nil else Seq("live.get" -> (() => viaLive()))) ++
        (if (live == null || !noInline) Nil else Seq("live.get, called" -> (() => viaLiveCalled())))
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
