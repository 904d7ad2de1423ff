package heapstate.bench

import heapstate.bench.BenchStores._

import java.io.File
import java.lang.management.ManagementFactory
import java.nio.file.{Files, Paths}

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.ObjectMapper
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.streaming.state._

/**
 * W3, store operations (after FLIP-140's ValueStateBenchmark): drives `StateStore` directly,
 * single-threaded, with no Spark job, for the HDFS provider, RocksDB with changelog checkpointing
 * on and off, and heapstate, side by side in one invocation, each provider in its own JVM.
 *
 * For K keys (a `long` key and a `long` value, as a count), it measures operations per ms for
 * get (existing keys), update (put on existing keys), put (new keys) and remove, each on a store
 * opened at the loaded version and aborted afterwards, and the time of a whole version cycle:
 * `getStore(v)`, U puts, `commit`. Each figure is the median of repeated runs after warm-up runs.
 * It also reports the heap retained per key after a full GC (RocksDB's native memory is not
 * counted).
 *
 * {{{
 *   bin/sbt "bench/run --size small"
 *   bin/sbt "bench/run --size full --providers hdfs,heapstate"
 *   bin/sbt "bench/runMain heapstate.bench.W3StoreOps --size full --rounds 3"
 * }}}
 * `--rounds N` runs every provider N times, taking turns, and reports each figure's median over
 * the rounds (the JSON keeps every round's value): on a shared machine one JVM's figures can be
 * off by 2x, and a ratio between two single JVMs run minutes apart inherits that.
 */
object W3StoreOps {
  final case class Size(keys: Seq[Int], ops: Int, updatesPerCycle: Int, warmups: Int, runs: Int, cycles: Int)
  val Sizes: Map[String, Size] = Map(
    "small" -> Size(Seq(10000, 100000), 10000, 10000, 1, 3, 3),
    "full" -> Size(Seq(10000, 1000000), 200000, 10000, 3, 5, 10),
    // One store of W5 at K = 1M and 4M (4 partitions): 250K and 1M keys, 2,500 updates a version.
    "w5-store" -> Size(Seq(250000, 1000000), 200000, 2500, 5, 3, 30)
  )

  private val CF = StateStore.DEFAULT_COL_FAMILY_NAME

  def main(args: Array[String]): Unit = {
    val opts = options(args)
    val sizeName = opts.getOrElse("size", "small")
    val size = Sizes.getOrElse(sizeName, sys.error(s"--size must be one of ${Sizes.keys.mkString(", ")}"))
    val providers = chosen(opts)
    opts.get("worker") match {
      case Some(out) => runWorker(providers.head, size, Paths.get(out))
      case None =>
        // One JVM per provider: a store call site that has seen only one class is inlined by the
        // JIT, so providers sharing a JVM would be measured under different conditions. With
        // several rounds the providers take turns, so that a slow spell of the machine (their
        // figures swing by up to 2x from one minute to the next here) falls on all of them.
        val rounds = opts.getOrElse("rounds", "1").toInt
        require(rounds >= 1, s"--rounds must be at least 1, not $rounds")
        val results = mutable.LinkedHashMap.empty[(String, Int), Seq[Map[String, Double]]]
        for (round <- 1 to rounds; p <- providers) {
          if (rounds > 1) System.err.println(s"[w3] round $round of $rounds: ${p.name}")
          val out = Files.createTempFile(s"w3-${p.name}", ".json")
          val cmd = Seq(javaBin, "-Xms6g", "-Xmx6g") ++ jvmOpens ++ Seq("-cp", System.getProperty("java.class.path"),
            "heapstate.bench.W3StoreOps", "--size", sizeName, "--providers", p.name, "--worker", out.toString)
          val code = new ProcessBuilder(cmd: _*).inheritIO().start().waitFor()
          if (code != 0) sys.error(s"the ${p.name} worker failed with exit code $code")
          val parsed = new ObjectMapper().readTree(out.toFile)
          parsed.fields().forEachRemaining { e =>
            val keys = e.getKey.toInt
            val figs = mutable.LinkedHashMap.empty[String, Double]
            e.getValue.fields().forEachRemaining(f => figs(f.getKey) = f.getValue.asDouble)
            results((p.name, keys)) = results.getOrElse((p.name, keys), Nil) :+ figs.toMap
          }
          Files.delete(out)
        }
        report(results.toMap, providers.map(_.name), size, sizeName, rounds, outFile(opts, "w3"))
    }
  }

  private def runWorker(p: Provider, size: Size, out: java.nio.file.Path): Unit = {
    val spark = SparkSession.builder().master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    // Starts the StateStoreCoordinator, as any streaming session has: without it, providers that
    // report to it (HDFS) wait for an RPC time-out on every call.
    spark.streams
    val json = new java.util.LinkedHashMap[String, AnyRef]()
    for (keys <- size.keys) {
      System.err.println(s"[w3] ${p.name}: $keys keys")
      val figs = measure(p, keys, size)
      System.err.println(s"[w3] ${p.name}: $keys keys: ${figs.map { case (k, v) => f"$k=$v%.1f" }.mkString(" ")}")
      val m = new java.util.LinkedHashMap[String, AnyRef]()
      figs.foreach { case (k, v) => m.put(k, Double.box(v)) }
      json.put(keys.toString, m)
    }
    spark.stop()
    Files.writeString(out, new ObjectMapper().writeValueAsString(json))
  }

  private def heapUsed(): Long = {
    for (_ <- 1 to 3) { System.gc(); Thread.sleep(100) }
    ManagementFactory.getMemoryMXBean.getHeapMemoryUsage.getUsed
  }

  private def measure(p: Provider, keys: Int, size: Size): Map[String, Double] = {
    val root = Files.createTempDirectory(s"w3-${p.name}").toString
    val heapBefore = heapUsed()
    val provider = open(p, root)
    val key = longRow()
    val value = longRow()
    val rnd = new scala.util.Random(42)
    val ops = math.min(size.ops, keys)
    val existing = Array.fill(ops)(rnd.nextInt(keys).toLong)
    var version = 0L

    // Load K keys as version 1.
    val t0 = System.nanoTime()
    val load = provider.getStore(0)
    var i = 0
    while (i < keys) { key.setLong(0, i); value.setLong(0, i); load.put(key, value, CF); i += 1 }
    load.commit(); version = 1
    val loadMs = (System.nanoTime() - t0) / 1e6
    val memoryUsed = load.metrics.memoryUsedBytes.toDouble
    val heapPerKey = (heapUsed() - heapBefore).toDouble / keys

    /** Runs `body` on a store opened at `version` and aborted after; returns ops per ms. */
    def opsPerMs(body: StateStore => Unit): Double = {
      val rates = (1 to size.warmups + size.runs).map { _ =>
        val store = provider.getStore(version)
        val start = System.nanoTime()
        body(store)
        val ms = (System.nanoTime() - start) / 1e6
        store.abort()
        ops / ms
      }
      median(rates.drop(size.warmups))
    }
    // A get reads the value it returns, as every operator does; otherwise a provider that hands
    // back a stored row without touching it would be timed for less work than the others.
    var sink = 0L
    val get = opsPerMs { s =>
      var j = 0
      while (j < ops) {
        key.setLong(0, existing(j)); val v = s.get(key, CF); if (v != null) sink += v.getLong(0); j += 1
      }
    }
    if (sink == 42) System.err.println("") // keeps `sink` alive
    val update = opsPerMs { s =>
      var j = 0; while (j < ops) { key.setLong(0, existing(j)); value.setLong(0, j); s.put(key, value, CF); j += 1 }
    }
    val put = opsPerMs { s =>
      var j = 0; while (j < ops) { key.setLong(0, keys.toLong + j); value.setLong(0, j); s.put(key, value, CF); j += 1 }
    }
    val remove = opsPerMs { s =>
      var j = 0; while (j < ops) { key.setLong(0, existing(j)); s.remove(key, CF); j += 1 }
    }

    // Version cycles: getStore(v), U puts on existing keys, commit.
    val u = math.min(size.updatesPerCycle, keys)
    val cycles = (1 to size.warmups + size.cycles).map { c =>
      val start = System.nanoTime()
      val store = provider.getStore(version)
      var j = 0
      while (j < u) { key.setLong(0, rnd.nextInt(keys).toLong); value.setLong(0, c); store.put(key, value, CF); j += 1 }
      val committing = System.nanoTime()
      version = store.commit()
      val end = System.nanoTime()
      ((end - start) / 1e6, (end - committing) / 1e6)
    }.drop(size.warmups)
    provider.close()
    deleteRecursively(new File(root))
    Map(
      "load_ms" -> loadMs,
      "get_ops_per_ms" -> get,
      "update_ops_per_ms" -> update,
      "put_ops_per_ms" -> put,
      "remove_ops_per_ms" -> remove,
      "cycle_ms" -> median(cycles.map(_._1)),
      "commit_ms" -> median(cycles.map(_._2)),
      "heap_bytes_per_key" -> heapPerKey,
      "memory_used_bytes" -> memoryUsed
    )
  }

  /** Prints and writes the figures: each the median over the rounds, every round's value kept in the JSON. */
  private def report(rounds: Map[(String, Int), Seq[Map[String, Double]]], names: Seq[String], size: Size,
      sizeName: String, roundCount: Int, file: java.nio.file.Path): Unit = {
    val results = rounds.map { case (at, figs) => at -> figs.head.keys.map(k => k -> median(figs.map(_(k)))).toMap }
    val figures = Seq(
      ("get ops/ms", "get_ops_per_ms", true),
      ("update ops/ms", "update_ops_per_ms", true),
      ("put (new key) ops/ms", "put_ops_per_ms", true),
      ("remove ops/ms", "remove_ops_per_ms", true),
      (s"version cycle ms (getStore, ${size.updatesPerCycle} puts, commit)", "cycle_ms", false),
      ("commit ms (in a cycle)", "commit_ms", false),
      ("load K keys, ms", "load_ms", false),
      ("heap bytes per key after GC", "heap_bytes_per_key", false),
      ("memoryUsedBytes", "memory_used_bytes", false)
    )
    for (keys <- size.keys) {
      println()
      println(f"W3 store operations, K=$keys%,d keys, ${math.min(size.ops,
          keys)}%,d ops per run, median of ${size.runs} runs after ${size.warmups} warm-ups" +
        (if (roundCount > 1) s"; median of $roundCount rounds, the providers taking turns" else ""))
      println(("figure" +: names).map(n => f"$n%-22s").mkString(
        " ") + "   (ratio to hdfs; for ops/ms, time per op = 1/ratio)")
      for ((label, key, _) <- figures) {
        val base = results.get(("hdfs", keys)).map(_(key))
        val cells = names.map { n =>
          val v = results((n, keys))(key)
          val r = base.filter(_ > 0).map(b => f" (${v / b}%.2fx)").getOrElse("")
          f"${v}%.1f$r"
        }
        println((label.take(22) +: cells).map(c => f"$c%-22s").mkString(" "))
      }
    }
    val json = new java.util.LinkedHashMap[String, AnyRef]()
    json.put("benchmark", "W3")
    json.put("timestamp", stamp); json.put("git", gitState())
    json.put("size", sizeName)
    json.put("spark", org.apache.spark.SPARK_VERSION)
    json.put("java", System.getProperty("java.version"))
    json.put("ops_per_run", Int.box(size.ops))
    json.put("updates_per_cycle", Int.box(size.updatesPerCycle))
    json.put("rounds", Int.box(roundCount))
    val rows = new java.util.ArrayList[AnyRef]()
    for (((name, keys), figs) <- results) {
      val row = new java.util.LinkedHashMap[String, AnyRef]()
      row.put("provider", name); row.put("keys", Int.box(keys))
      figs.foreach { case (k, v) => row.put(k, Double.box(v)) }
      val each = new java.util.LinkedHashMap[String, AnyRef]()
      figs.keys.foreach(k => each.put(k, rounds((name, keys)).map(r => Double.box(r(k))).asJava))
      row.put("rounds", each)
      rows.add(row)
    }
    json.put("results", rows)
    Files.writeString(file, new ObjectMapper().writerWithDefaultPrettyPrinter().writeValueAsString(json))
    println(s"\nJSON: $file")
  }
}
