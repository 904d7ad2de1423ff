package heapstate.bench

import java.util.UUID

import org.apache.hadoop.conf.Configuration
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.{LongType, StructField, StructType}

/** What the Scala benchmarks share: the providers and how a store is opened outside a query. */
object BenchStores {
  final case class Provider(name: String, className: String, confs: Map[String, String])

  private val RocksDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
  private val Changelog = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"

  /** The providers compared, by the names bench/_common.py gives them, baseline first. */
  val Providers: Seq[Provider] = Seq(
    Provider("hdfs", "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider", Map.empty),
    Provider("rocksdb-changelog", RocksDB, Map(Changelog -> "true")),
    Provider("rocksdb", RocksDB, Map(Changelog -> "false")),
    Provider("heapstate", "heapstate.HeapStateStoreProvider", Map.empty)
  )

  /** The `java` of this JVM, for benchmarks that run each provider in a JVM of its own. */
  def javaBin: String = java.nio.file.Paths.get(System.getProperty("java.home"), "bin", "java").toString

  /** This JVM's `--add-opens` flags (sbt's `bench/run` passes Spark's), for the JVMs it starts. */
  def jvmOpens: Seq[String] =
    java.lang.management.ManagementFactory.getRuntimeMXBean.getInputArguments.toArray.map(_.toString).toSeq
      .filter(_.startsWith("--add-opens"))

  /** The middle value of `xs` (the upper one of an even count). */
  def median[T: Ordering](xs: Seq[T]): T = xs.sorted.apply(xs.size / 2)

  def deleteRecursively(f: java.io.File): Unit = {
    Option(f.listFiles).foreach(_.foreach(deleteRecursively))
    f.delete()
  }

  /** `--name value` pairs of a command line. */
  def options(args: Array[String]): Map[String, String] =
    args.sliding(2, 2).collect { case Array(k, v) if k.startsWith("--") => k.drop(2) -> v }.toMap

  /** The providers named by `--providers` (comma-separated), or all of them. */
  def chosen(opts: Map[String, String]): Seq[Provider] =
    opts.get("providers").map(_.split(",").toSeq.map(_.trim).filter(_.nonEmpty)).getOrElse(Providers.map(_.name))
      .map(n =>
        Providers.find(_.name == n).getOrElse(
          sys.error(s"--providers: unknown provider $n; choose from ${Providers.map(_.name).mkString(", ")}")))

  /** When this run started, as the Python benchmarks stamp their reports. */
  val stamp: String =
    java.time.LocalDateTime.now.format(java.time.format.DateTimeFormatter.ofPattern("yyyyMMdd-HHmmss"))

  /** The commit the benchmark ran at and whether the work tree had changes, for the report. */
  def gitState(): java.util.Map[String, AnyRef] = {
    def git(args: String*): String =
      try {
        val p = new ProcessBuilder(("git" +: args): _*).redirectErrorStream(true).start()
        val out = new String(p.getInputStream.readAllBytes()).trim
        if (p.waitFor() == 0) out else ""
      } catch { case _: java.io.IOException => "" }
    val m = new java.util.LinkedHashMap[String, AnyRef]()
    m.put("commit", git("rev-parse", "HEAD"))
    m.put("dirty", java.lang.Boolean.valueOf(git("status", "--porcelain").nonEmpty))
    m
  }

  /** `--out`, or `bench/results/<prefix>-<timestamp>.json`. */
  def outFile(opts: Map[String, String], prefix: String): java.nio.file.Path = {
    val file = opts.get("out").map(java.nio.file.Paths.get(_))
      .getOrElse(java.nio.file.Paths.get("bench", "results", s"$prefix-$stamp.json"))
    Option(file.toAbsolutePath.getParent).foreach(java.nio.file.Files.createDirectories(_))
    file
  }

  /** A `long` key and a `long` value (a count). */
  val keySchema: StructType = StructType(Seq(StructField("k", LongType, nullable = false)))
  val valueSchema: StructType = StructType(Seq(StructField("count", LongType, nullable = false)))

  /** A one-`long` row to set and reuse; providers copy what they keep. */
  def longRow(): UnsafeRow = {
    val row = new UnsafeRow(1)
    row.pointTo(new Array[Byte](16), 16)
    row
  }

  /** Opens partition 0 of operator 0 of a store under `root` with `p`, as a query would. */
  def open(p: Provider, root: String): StateStoreProvider = {
    val provider = StateStoreProvider.create(p.className)
    provider.init(StateStoreId(root, 0, 0), keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
      false, storeConf(p), hadoopConf(), false, None)
    provider
  }

  private def storeConf(p: Provider): StateStoreConf = {
    val sql = new SQLConf()
    sql.setConfString("spark.sql.streaming.stateStore.commitValidation.enabled", "false")
    sql.setConfString("spark.sql.streaming.minBatchesToRetain", "100")
    p.confs.foreach { case (k, v) => sql.setConfString(k, v) }
    new StateStoreConf(sql)
  }

  /** What a streaming query's Hadoop conf carries and the HDFS provider requires: a run id. */
  private def hadoopConf(): Configuration = {
    val conf = new Configuration()
    conf.set("sql.streaming.queryId", UUID.randomUUID().toString)
    conf.set("sql.streaming.runId", UUID.randomUUID().toString)
    conf
  }
}
