package heapstate.bench

import java.io.File
import java.nio.file.Files

import com.fasterxml.jackson.databind.ObjectMapper
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.streaming.state._

/**
 * W2, squashing: one version in which each of U keys is written m times (m = 1, 10, 100), as
 * state updated once per input row does; reports the bytes that version adds to the checkpoint
 * (journal, delta or changelog) for each provider (HDFS, RocksDB with changelog checkpointing on
 * and off, heapstate), side by side, with ratios against HDFS. The store is written directly, with
 * no Spark job; every provider sees the same puts. `--size small` is U = 1,000 keys, `full` (the
 * default) U = 10,000; `--keys` overrides U.
 *
 * {{{
 *   bin/sbt "bench/runMain heapstate.bench.W2Squashing --size small"
 *   bin/sbt "bench/runMain heapstate.bench.W2Squashing --size full --providers hdfs,heapstate"
 * }}}
 */
object W2Squashing {
  private val CF = StateStore.DEFAULT_COL_FAMILY_NAME
  private val Repeats = Seq(1, 10, 100)
  private val Sizes = Map("small" -> 1000, "full" -> 10000)

  def main(args: Array[String]): Unit = {
    val opts = BenchStores.options(args)
    val sizeName = opts.getOrElse("size", "full")
    val sizeKeys = Sizes.getOrElse(sizeName, sys.error(s"--size must be one of ${Sizes.keys.mkString(", ")}"))
    val keys = opts.get("keys").map(_.toInt).getOrElse(sizeKeys)
    val spark = SparkSession.builder().master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.streams // starts the StateStoreCoordinator, as a streaming session has
    val providers = BenchStores.chosen(opts)
    val bytes = for (p <- providers; m <- Repeats) yield (p.name, m) -> versionBytes(p, keys, m)
    spark.stop()
    val table = bytes.toMap
    println()
    println(
      f"W2 squashing: one version in which each of $keys%,d keys is written m times; bytes it adds to the checkpoint")
    println(("m" +: providers.map(_.name)).map(c => f"$c%-24s").mkString(" ") + "   (ratio to hdfs)")
    for (m <- Repeats) {
      val base = table.get(("hdfs", m)).map(_.toDouble)
      val cells = providers.map { p =>
        val b = table((p.name, m))
        f"$b%,d" + base.map(x => f" (${b / x}%.2fx)").getOrElse("")
      }
      println((m.toString +: cells).map(c => f"$c%-24s").mkString(" "))
    }
    for (p <- providers) {
      val growth = table((p.name, 100)).toDouble / table((p.name, 1))
      println(f"${p.name}%-18s bytes at m=100 / m=1: $growth%.2f")
    }
    val file = BenchStores.outFile(opts, "w2")
    val json = new java.util.LinkedHashMap[String, AnyRef]()
    json.put("benchmark", "W2"); json.put("timestamp", BenchStores.stamp); json.put("git", BenchStores.gitState())
    json.put("size", sizeName); json.put("keys", Int.box(keys))
    json.put("spark", org.apache.spark.SPARK_VERSION); json.put("java", System.getProperty("java.version"))
    val rows = new java.util.ArrayList[AnyRef]()
    for (((name, m), b) <- bytes) {
      val row = new java.util.LinkedHashMap[String, AnyRef]()
      row.put("provider", name); row.put("m", Int.box(m)); row.put("version_bytes", Long.box(b)); rows.add(row)
    }
    json.put("results", rows)
    Files.writeString(file, new ObjectMapper().writerWithDefaultPrettyPrinter().writeValueAsString(json))
    println(s"\nJSON: $file")
  }

  /** Loads the keys as version 1, then writes version 2 with m puts per key; returns its file bytes. */
  private def versionBytes(p: BenchStores.Provider, keys: Int, m: Int): Long = {
    val root = Files.createTempDirectory(s"w2-${p.name}").toString
    val provider = BenchStores.open(p, root)
    val key = BenchStores.longRow()
    val value = BenchStores.longRow()
    val load = provider.getStore(0)
    for (k <- 0 until keys) { key.setLong(0, k); value.setLong(0, 0); load.put(key, value, CF) }
    load.commit()
    val before = dirBytes(new File(root))
    val store = provider.getStore(1)
    for (i <- 1 to m; k <- 0 until keys) { key.setLong(0, k); value.setLong(0, i); store.put(key, value, CF) }
    store.commit()
    val added = dirBytes(new File(root)) - before
    provider.close()
    System.err.println(s"[w2] ${p.name} m=$m: $added bytes")
    added
  }

  /** Bytes of the state files (temporary and checksum files excluded). */
  private def dirBytes(f: File): Long =
    if (f.isDirectory) Option(f.listFiles).toSeq.flatten.map(dirBytes).sum
    else if (f.getName.startsWith(".") || f.getName.endsWith(".crc")) 0L
    else f.length()
}
