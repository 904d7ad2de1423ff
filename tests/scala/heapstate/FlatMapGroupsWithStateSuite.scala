package heapstate

import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.{Files, Path => JPath}
import java.sql.Timestamp

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.{Dataset, SparkSession}
import org.apache.spark.sql.functions.expr
import org.apache.spark.sql.streaming.{GroupState, GroupStateTimeout, OutputMode, Trigger}
import org.scalatest.BeforeAndAfterAll
import org.scalatest.funsuite.AnyFunSuite

/** A row of the input stream: key, event time in minutes after 2024, and as a timestamp. */
final case class FmgEvent(k: String, t: Int, ts: Timestamp)
/** What the stateful function keeps per key: its row count and latest event time (minutes). */
final case class FmgCount(n: Long, latest: Long)
final case class FmgOut(k: String, n: Long, status: String)

object FlatMapGroupsWithStateSuite {
  /** 2024-01-01T00:00:00Z, in seconds: event times are whole minutes after it. */
  val Epoch2024 = 1704067200L
  val TimeoutAfterMin = 15

  /**
   * Running count per key; emits it again with status "timeout" when the key goes quiet for 15
   * minutes of event time, and forgets the key.
   */
  def countUntilTimeout(key: String, events: Iterator[FmgEvent], state: GroupState[FmgCount]): Iterator[FmgOut] =
    if (state.hasTimedOut) {
      val n = state.get.n
      state.remove()
      Iterator(FmgOut(key, n, "timeout"))
    } else {
      val prior = state.getOption.getOrElse(FmgCount(0, Long.MinValue))
      var n = prior.n
      var latest = prior.latest
      events.foreach { e => n += 1; latest = math.max(latest, e.t.toLong) }
      state.update(FmgCount(n, latest))
      state.setTimeoutTimestamp((Epoch2024 + (latest + TimeoutAfterMin) * 60) * 1000)
      Iterator(FmgOut(key, n, "update"))
    }

  /** What [[countSeeingWriters]] saw of [[heapstate.engine.StateEngine.storesWriting]], call by call. */
  val WritersSeen = new java.util.concurrent.ConcurrentLinkedQueue[Integer]()
  /** A key whose call fails its task, or null. */
  @volatile var FailOnKey: String = null

  /** [[countUntilTimeout]], recording how many stores tasks write as it runs (inside one of them). */
  def countSeeingWriters(key: String, events: Iterator[FmgEvent], state: GroupState[FmgCount]): Iterator[FmgOut] = {
    WritersSeen.add(heapstate.engine.StateEngine.storesWriting)
    if (key == FailOnKey) throw new IllegalStateException(s"the test fails the task of key $key")
    countUntilTimeout(key, events, state)
  }

  /** One file per batch: (key, event minute). The first three run before the restart. */
  val Batches: Seq[Seq[(String, Int)]] = Seq(
    Seq("a" -> 0, "a" -> 1, "b" -> 2),
    Seq("a" -> 3),
    Seq("c" -> 4),
    Seq("a" -> 20), // after the restart
    Seq("c" -> 40),
    Seq("d" -> 50))
  val BeforeRestart = 3

  /**
   * Timeouts fire once the watermark (the latest event time less 10 minutes) passes a key's
   * latest + 15: batch 6 runs at watermark 30 (b: 2 + 15 = 17), batch 7 at 40 (a: 20 + 15 = 35).
   */
  val Expected: Seq[(Long, Seq[(String, Long, String)])] = Seq(
    0L -> Seq(("a", 2L, "update"), ("b", 1L, "update")),
    1L -> Seq(("a", 3L, "update")),
    2L -> Seq(("c", 1L, "update")),
    3L -> Seq(), // the no-data batch that ends the first run: nothing is due yet
    4L -> Seq(("a", 4L, "update")),
    5L -> Seq(("c", 2L, "update")),
    6L -> Seq(("b", 1L, "timeout"), ("d", 1L, "update")),
    7L -> Seq(("a", 4L, "timeout"))
  ) // a's count includes its three rows from before the restart

  val HdfsProvider = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
  val HeapProvider: String = classOf[HeapStateStoreProvider].getName
  val ProviderConf = "spark.sql.streaming.stateStore.providerClass"
  val FormatConf = "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion"
  /**
   * Spark's check of the rows a provider reads from its files. Format 1's value schema declares
   * the timeout timestamp an integer while the rows hold a long, so with a timeout set the check
   * fails every reload of a format-1 store, on the HDFS provider too (Spark 4.2: "Fixed-length
   * field validation error: field: StructField(timeoutTimestamp,IntegerType,true)"). The
   * format-1 runs with a restart turn it off, on both providers alike; a format-1 run without a
   * restart keeps it on, and runs on both.
   */
  val FormatValidationConf = "spark.sql.streaming.stateStore.formatValidation.enabled"
}

/**
 * flatMapGroupsWithState, the typed arbitrary-state operator of Scala and Java (PySpark's
 * applyInPandasWithState is tested in tests/python/test_operators.py), on heapstate and on Spark's
 * HDFS provider, in both of Spark's state formats: format 1 stores the state's fields and the timeout
 * timestamp as the value row's own columns, format 2 nests the state in a struct. Update mode
 * with an event-time timeout, and a restart in the middle of the stream.
 *
 * Each run asserts that heapstate's micro-batches equal the HDFS provider's batch by batch, that
 * both equal what the function gives for the input (written out above), that the checkpoint pins
 * the format and provider, and that each store holds its own provider's files.
 */
class FlatMapGroupsWithStateSuite extends AnyFunSuite with BeforeAndAfterAll {
  import FlatMapGroupsWithStateSuite._

  private var spark: SparkSession = _

  override def beforeAll(): Unit = {
    spark = SparkSession.builder()
      .master("local[2]")
      .appName(getClass.getSimpleName)
      .config("spark.ui.enabled", "false")
      .config("spark.sql.shuffle.partitions", "2")
      .config("spark.sql.session.timeZone", "UTC")
      .getOrCreate()
  }

  override def afterAll(): Unit = if (spark != null) spark.stop()

  /** Writes batch `i` as one JSON-lines file, with a modification time that orders it. */
  private def writeBatch(dir: JPath, i: Int): Unit = {
    Files.createDirectories(dir)
    val lines = Batches(i).map { case (k, t) => s"""{"k": "$k", "t": $t}""" }.mkString("", "\n", "\n")
    val tmp = dir.resolve(s".batch-$i.json.tmp")
    Files.write(tmp, lines.getBytes(UTF_8))
    Files.setLastModifiedTime(tmp, java.nio.file.attribute.FileTime.fromMillis(1700000000000L + i * 1000L))
    Files.move(tmp, dir.resolve(f"batch-$i%03d.json"))
  }

  /** Runs the query with Trigger.AvailableNow until it ends; returns each batch's sorted rows. */
  private def runAvailableNow(
      input: JPath,
      checkpoint: JPath,
      fn: (String, Iterator[FmgEvent],
          GroupState[FmgCount]) => Iterator[FmgOut] = countUntilTimeout): Seq[(Long, Seq[(String, Long, String)])] = {
    val session = spark
    import session.implicits._
    val collected = new java.util.concurrent.ConcurrentLinkedQueue[(Long, Seq[(String, Long, String)])]()
    val events = spark.readStream
      .schema("k STRING, t INT")
      .option("maxFilesPerTrigger", 1)
      .json(input.toString)
      .withColumn("ts", expr(s"timestamp_seconds($Epoch2024 + t * 60)"))
      .withWatermark("ts", "10 minutes")
      .as[FmgEvent]
    val out = events
      .groupByKey(_.k)
      .flatMapGroupsWithState(OutputMode.Update(), GroupStateTimeout.EventTimeTimeout())(fn)
    val sink: (Dataset[FmgOut], Long) => Unit = (batch, id) =>
      collected.add(id -> batch.collect().toSeq.map(o => (o.k, o.n, o.status)).sorted)
    val query = out.writeStream
      .outputMode(OutputMode.Update())
      .option("checkpointLocation", checkpoint.toString)
      .trigger(Trigger.AvailableNow())
      .foreachBatch(sink)
      .start()
    try assert(query.awaitTermination(240000), s"the query on $checkpoint did not end within 240 s")
    finally query.stop()
    query.exception.foreach(e => throw e)
    collected.asScala.toSeq.sortBy(_._1)
  }

  /**
   * The run before the restart of `provider` in directory `dir`, and (with `restart`) the run
   * after it; the batches of both.
   */
  private def run(
      dir: JPath, provider: String, format: Int, restart: Boolean = true): Seq[(Long, Seq[(String, Long, String)])] = {
    val (input, checkpoint) = (dir.resolve("input"), dir.resolve("checkpoint"))
    spark.conf.set(ProviderConf, provider)
    spark.conf.set(FormatConf, format.toString)
    spark.conf.set(FormatValidationConf, (format != 1 || !restart).toString)
    try {
      (0 until BeforeRestart).foreach(writeBatch(input, _))
      val first = runAvailableNow(input, checkpoint)
      if (!restart) return first
      (BeforeRestart until Batches.size).foreach(writeBatch(input, _))
      // The restart's session asks for the other provider and format: the checkpoint's own must win.
      spark.conf.set(ProviderConf, if (provider == HeapProvider) HdfsProvider else HeapProvider)
      spark.conf.set(FormatConf, (3 - format).toString)
      val second = runAvailableNow(input, checkpoint)
      assert(first.nonEmpty && second.nonEmpty, s"$provider, format $format: a run produced no batch")
      first ++ second
    } finally {
      Seq(ProviderConf, FormatConf, FormatValidationConf).foreach(spark.conf.unset)
    }
  }

  /** The confs every offset log entry of `checkpoint` pins. */
  private def pinnedConfs(checkpoint: JPath): Seq[Map[String, String]] = {
    val offsets = scala.util.Using.resource(Files.list(checkpoint.resolve("offsets")))(_.iterator().asScala.toList)
      .filter(_.getFileName.toString.forall(_.isDigit)).sortBy(_.getFileName.toString.toLong)
    assert(offsets.nonEmpty, s"$checkpoint has no offset log")
    offsets.map { f =>
      val line = Files.readAllLines(f, UTF_8).asScala.find(_.contains("\"conf\""))
        .getOrElse(fail(s"$f has no metadata line"))
      val conf = org.json4s.jackson.JsonMethods.parse(line) \ "conf"
      conf.values.asInstanceOf[Map[String, Any]].map { case (k, v) => k -> v.toString }
    }
  }

  /** The state file names (`<version>.<kind>`) of every store under `checkpoint`. */
  private def stateFiles(checkpoint: JPath): Seq[String] =
    scala.util.Using.resource(Files.walk(checkpoint.resolve("state")))(_.iterator().asScala.toList)
      .filter(p => Files.isRegularFile(p) && !p.getFileName.toString.startsWith("."))
      .map(_.getFileName.toString).filter(_.matches("""\d+\..+"""))

  /** Runs `body` with a fresh directory for each provider, deleted afterwards. */
  private def withDirs[T](body: (JPath, JPath) => T): T = {
    val (hdfsDir, heapDir) =
      (Files.createTempDirectory("heapstate-fmgws"), Files.createTempDirectory("heapstate-fmgws"))
    try body(hdfsDir, heapDir)
    finally Seq(hdfsDir, heapDir).foreach(d => org.apache.commons.io.FileUtils.deleteDirectory(d.toFile))
  }

  for (format <- Seq(1, 2)) {
    test(
      s"flatMapGroupsWithState, state format $format, with an event-time timeout and a restart: equal to HDFS and to the model") {
      withDirs { (hdfsDir, heapDir) =>
        val hdfs = run(hdfsDir, HdfsProvider, format)
        val heap = run(heapDir, HeapProvider, format)
        val (hdfsCheckpoint, heapCheckpoint) = (hdfsDir.resolve("checkpoint"), heapDir.resolve("checkpoint"))

        assert(hdfs == Expected, s"format $format: the HDFS provider's batches")
        assert(heap == hdfs, s"format $format: heapstate's batches differ from the HDFS provider's")

        for ((checkpoint, provider) <- Seq(hdfsCheckpoint -> HdfsProvider, heapCheckpoint -> HeapProvider)) {
          val pinned = pinnedConfs(checkpoint)
          assert(pinned.forall(_.get(FormatConf).contains(format.toString)),
            s"$checkpoint: the offset log's state format")
          assert(pinned.forall(_.get(ProviderConf).contains(provider)), s"$checkpoint: the offset log's provider")
          // The operator really used the format: format 2's value schema nests the state in `groupState`.
          val schema = new String(Files.readAllBytes(checkpoint.resolve("state/0/0/_metadata/schema")), UTF_8)
          assert(schema.contains("\"groupState\"") == (format == 2),
            s"$checkpoint: the state schema of format $format: $schema")
        }
        val heapFiles = stateFiles(heapCheckpoint)
        assert(heapFiles.exists(_.endsWith(".hs-journal")), s"heapstate wrote no journal: $heapFiles")
        assert(heapFiles.forall(_.matches("""\d+\.hs-(journal|snapshot)""")),
          s"heapstate's stores hold other files: $heapFiles")
        assert(stateFiles(hdfsCheckpoint).forall(_.matches("""\d+\.(delta|snapshot)""")))
      }
    }
  }

  test(
    "flatMapGroupsWithState, state format 1, with an event-time timeout and Spark's row check on: runs until a restart, as on HDFS") {
    // The check fails format 1's rows with a timeout (see FormatValidationConf), but Spark's
    // providers apply it to rows read from files: a query that does not restart runs.
    withDirs { (hdfsDir, heapDir) =>
      val hdfs = run(hdfsDir, HdfsProvider, format = 1, restart = false)
      val heap = run(heapDir, HeapProvider, format = 1, restart = false)
      assert(hdfs == Expected.take(BeforeRestart + 1), "the HDFS provider's batches")
      assert(heap == hdfs, "heapstate's batches differ from the HDFS provider's")
    }
  }

  test(
    "a task writing a heapstate store counts in StateEngine.storesWriting, for background snapshots to wait for; a failed task leaves none counted") {
    import heapstate.engine.StateEngine
    withDirs { (_, dir) =>
      spark.conf.set(ProviderConf, HeapProvider)
      try {
        val input = dir.resolve("input")
        (0 until BeforeRestart).foreach(writeBatch(input, _))
        WritersSeen.clear()
        val batches = runAvailableNow(input, dir.resolve("ok"), countSeeingWriters)
        assert(batches == Expected.take(BeforeRestart + 1), "the query's batches")
        val seen = WritersSeen.asScala.toList.map(_.intValue)
        assert(seen.nonEmpty && seen.forall(n => n >= 1 && n <= 2),
          s"inside a task of two partitions on two cores, between 1 and 2 stores written: $seen")
        assert(StateEngine.storesWriting == 0, "stores still counted after the query committed its batches")

        FailOnKey = "b"
        val failed = intercept[Exception](runAvailableNow(input, dir.resolve("failed"), countSeeingWriters))
        assert(
          Iterator.iterate(failed: Throwable)(_.getCause).takeWhile(_ != null)
            .exists(e => String.valueOf(e.getMessage).contains("the test fails the task of key b")),
          failed
        )
        // The task's completion listener runs before Spark hears the task failed; allow the
        // driver's side a moment all the same.
        val deadline = System.nanoTime() + 10000000000L
        while (StateEngine.storesWriting != 0 && System.nanoTime() < deadline) Thread.sleep(10)
        assert(StateEngine.storesWriting == 0, "the failed task's store is still counted")
      } finally {
        FailOnKey = null
        spark.conf.unset(ProviderConf)
      }
    }
  }
}
