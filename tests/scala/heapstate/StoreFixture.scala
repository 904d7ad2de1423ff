package heapstate

import java.nio.file.{Files, Path}
import java.util.concurrent.ConcurrentLinkedQueue

import scala.jdk.CollectionConverters._

import org.apache.commons.io.FileUtils
import org.apache.hadoop.conf.Configuration
import org.apache.logging.log4j.LogManager
import org.apache.logging.log4j.core.{LogEvent, Logger}
import org.apache.logging.log4j.core.appender.AbstractAppender
import org.apache.logging.log4j.core.config.Property
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

/** Builds providers on a temporary directory, and the rows the tests put in them. */
object StoreFixture {
  /**
   * Spark's FileContext-based checkpoint manager (its default for HDFS and object stores) and its
   * FileSystem-based one: named in `spark.sql.streaming.checkpointFileManagerClass`, either makes a
   * store take its directory for one off the local disk while the files stay on it. The second
   * keeps the earlier file of a name a rename would replace.
   */
  val FileContextManager =
    "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
  val FileSystemManager = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"

  val keySchema: StructType = StructType(Seq(StructField("k", LongType, nullable = false)))
  val valueSchema: StructType = StructType(Seq(StructField("v", LongType, nullable = false)))
  /** For prefix scans: (group string, session start long), prefix = group. */
  val prefixKeySchema: StructType = StructType(Seq(
      StructField("g", StringType, nullable = false), StructField("t", LongType, nullable = false)))

  private val longProj = UnsafeProjection.create(Array[DataType](LongType))
  private val prefixKeyProj = UnsafeProjection.create(Array[DataType](StringType, LongType))
  private val stringProj = UnsafeProjection.create(Array[DataType](StringType))

  /** Projections reuse one buffer: rows are built under a lock, so that concurrent tests get their own. */
  def row(n: Long): UnsafeRow = longProj.synchronized(longProj(InternalRow(n)).copy())
  def prefixKey(g: String, t: Long): UnsafeRow = prefixKeyProj(InternalRow(UTF8String.fromString(g), t)).copy()
  def prefix(g: String): UnsafeRow = stringProj(InternalRow(UTF8String.fromString(g))).copy()

  def tempDir(): String = tempPath("heapstate-test").toString

  /** A new temporary directory, deleted with everything in it when the test JVM exits. */
  def tempPath(prefix: String): Path = {
    val dir = Files.createTempDirectory(prefix)
    made.add(dir)
    dir
  }

  private val made = new ConcurrentLinkedQueue[Path]()
  sys.addShutdownHook(made.asScala.foreach(dir => FileUtils.deleteQuietly(dir.toFile)))

  def storeConf(confs: Map[String, String] = Map.empty, minVersionsToRetain: Int = 10): StateStoreConf = {
    val sql = new SQLConf()
    sql.setConfString("spark.sql.streaming.minBatchesToRetain", minVersionsToRetain.toString)
    sql.setConfString("spark.sql.streaming.stateStore.commitValidation.enabled", "false")
    confs.foreach { case (k, v) => sql.setConfString(k, v) }
    new StateStoreConf(sql)
  }

  def provider(
      root: String,
      confs: Map[String, String] = Map.empty,
      minVersionsToRetain: Int = 10,
      partition: Int = 0,
      prefixScan: Boolean = false,
      values: StructType = valueSchema): HeapStateStoreProvider = {
    val p = new HeapStateStoreProvider
    val (ks, spec) =
      if (prefixScan) (prefixKeySchema, PrefixKeyScanStateEncoderSpec(prefixKeySchema, 1))
      else (keySchema, NoPrefixKeyStateEncoderSpec(keySchema))
    // As Spark's session does, the SQL settings go into the Hadoop configuration too (the
    // checkpoint file manager's class among them).
    val hadoopConf = new Configuration()
    confs.foreach { case (k, v) => hadoopConf.set(k, v) }
    p.init(StateStoreId(root, 0, partition), ks, values, spec, false,
      storeConf(confs, minVersionsToRetain), hadoopConf, false, None)
    p
  }

  def contents(store: ReadStateStore): Map[Long, Long] = {
    val it = store.iterator(StateStore.DEFAULT_COL_FAMILY_NAME)
    val out = scala.collection.mutable.Map.empty[Long, Long]
    while (it.hasNext) {
      val p = it.next()
      val k = p.key.getLong(0)
      assert(!out.contains(k), s"key $k returned twice by iterator")
      out(k) = p.value.getLong(0)
    }
    out.toMap
  }

  def get(store: ReadStateStore, k: Long): Option[Long] =
    Option(store.get(row(k), StateStore.DEFAULT_COL_FAMILY_NAME)).map(_.getLong(0))

  def put(store: StateStore, k: Long, v: Long): Unit = store.put(row(k), row(v), StateStore.DEFAULT_COL_FAMILY_NAME)
  def remove(store: StateStore, k: Long): Unit = store.remove(row(k), StateStore.DEFAULT_COL_FAMILY_NAME)

  def storeDir(root: String, partition: Int = 0): java.io.File = new java.io.File(s"$root/0/$partition")

  /** What the logger of class `of` logs while `body` runs: each line's level and message. */
  def logged[T](of: Class[_])(body: => T): (T, Seq[(String, String)]) = {
    val logger = LogManager.getLogger(of).asInstanceOf[Logger]
    val lines = new ConcurrentLinkedQueue[(String, String)]()
    val appender = new AbstractAppender(s"heapstate-test-${of.getSimpleName}", null, null, true, Property.EMPTY_ARRAY) {
      override def append(event: LogEvent): Unit =
        lines.add(event.getLevel.name -> event.getMessage.getFormattedMessage)
    }
    appender.start()
    logger.addAppender(appender)
    try { val out = body; (out, lines.asScala.toSeq) }
    finally { logger.removeAppender(appender); appender.stop() }
  }
}
