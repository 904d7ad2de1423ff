package heapstate.tools

import java.io.FileNotFoundException
import java.util.{ArrayList => JList, LinkedHashMap => JMap, UUID}

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal
import scala.util.hashing.MurmurHash3

import com.fasterxml.jackson.databind.ObjectMapper
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.StructType

import heapstate.{HeapStateConf, HeapStateStoreProvider}
import heapstate.io.StateFiles

/**
 * Converts the state of a stopped query, as of one committed version, between Spark's
 * HDFSBackedStateStoreProvider and heapstate, for `heapstate migrate` (which calls it through
 * py4j and does the checkpoint-level work: the safety checks, the backups, publishing the staged
 * files and the offset log).
 *
 * For every operator, partition and store under `<checkpoint>/state`, it:
 *   1. reads the key and value schemas Spark recorded (`state/<op>/0[/<store>]/_metadata/schema`)
 *      and the operator's stores (`state/<op>/_metadata/metadata`);
 *   2. opens the store at `version` with the source provider itself, through the
 *      `StateStoreProvider` API, and iterates it: no provider's files are parsed here;
 *   3. writes the state as the target's full snapshot at `version`, into the staging directory
 *      (`<staging>/state/<op>/<partition>[/<store>]`), never into the checkpoint:
 *      - heapstate: `<version>.hs-snapshot`, through heapstate's `io` layer;
 *      - HDFS: the HDFS provider itself writes the snapshot, as version 1 of a scratch store
 *        (`getStore(0)`, every row put, commit with a forced snapshot); its snapshot file does
 *        not record its version, so it is renamed to `<version>.snapshot`;
 *   4. loads `version` back from the staging directory with the target provider, and checks that
 *      it holds exactly the rows read from the source: the same count and the same
 *      order-independent 64-bit digest of every key's and value's bytes.
 *
 * With no staging directory (a dry run) it stops after step 2: it reads and counts, and writes
 * nothing. Any failure names the operator, partition and store at fault, and the caller
 * publishes nothing.
 */
object CheckpointMigration {
  val HdfsProvider = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
  val HeapProvider: String = classOf[HeapStateStoreProvider].getName
  val Supported: Seq[String] = Seq(HdfsProvider, HeapProvider)

  private val json = new ObjectMapper()

  /** One store of one partition of one stateful operator, with what a provider needs to open it. */
  final case class StoreSpec(
      operatorId: Long,
      operatorName: String,
      partition: Int,
      storeName: String,
      keySchema: StructType,
      valueSchema: StructType,
      numColsPrefixKey: Int) {
    def encoderSpec: KeyStateEncoderSpec =
      if (numColsPrefixKey > 0) PrefixKeyScanStateEncoderSpec(keySchema, numColsPrefixKey)
      else NoPrefixKeyStateEncoderSpec(keySchema)
    def id(stateRoot: Path): StateStoreId = StateStoreId(stateRoot.toString, operatorId, partition, storeName)
    def relativeDir: String =
      s"$operatorId/$partition" + (if (storeName == StateStoreId.DEFAULT_STORE_NAME) "" else s"/$storeName")
    override def toString: String = s"operator $operatorId ($operatorName), partition $partition, store $storeName"
  }

  /** A failed conversion, naming the store (and through its message, the file) at fault. */
  final class MigrationException(message: String, cause: Throwable) extends RuntimeException(message, cause)

  /**
   * The py4j entry point. `confJson` is a JSON object of SQL confs: those the checkpoint's newest
   * offset log entry pins, plus heapstate's. `staging` is null for a dry run. Returns a JSON
   * report: every store with its schemas, its row count, and the files staged for it.
   */
  def runJson(
      checkpoint: String,
      sourceProvider: String,
      targetProvider: String,
      version: Long,
      confJson: String,
      staging: String): String = {
    val confs = json.readValue(confJson, classOf[java.util.Map[String, String]]).asScala.toMap
    val report = run(checkpoint, sourceProvider, targetProvider, version, confs, Option(staging), new Configuration())
    json.writerWithDefaultPrettyPrinter().writeValueAsString(report)
  }

  def run(
      checkpoint: String,
      sourceProvider: String,
      targetProvider: String,
      version: Long,
      confs: Map[String, String],
      staging: Option[String],
      baseHadoopConf: Configuration): JMap[String, AnyRef] = {
    for (p <- Seq(sourceProvider, targetProvider) if !Supported.contains(p)) {
      throw new IllegalArgumentException(s"heapstate migrate converts between $HdfsProvider and " +
        s"$HeapProvider only, not $p")
    }
    if (sourceProvider == targetProvider) {
      throw new IllegalArgumentException(s"the source and target provider are both $sourceProvider")
    }
    if (version < 1) throw new IllegalArgumentException(s"version $version: there is no committed state to convert")
    val hadoopConf = new Configuration(baseHadoopConf)
    // Both providers expect to run inside a query, whose run id the Hadoop conf carries
    // (StreamExecution.RUN_ID_KEY); a fresh one keeps this tool's stores apart from any other.
    hadoopConf.set("sql.streaming.runId", UUID.randomUUID().toString)
    val stateRoot = new Path(checkpoint, "state")
    val specs = discover(stateRoot, hadoopConf)
    val stagingRoot = staging.map(s => new Path(s))
    val storeConf = stateStoreConf(confs)
    val stores = new JList[AnyRef]()
    for (spec <- specs) {
      val entry =
        try convert(spec, stateRoot, stagingRoot, sourceProvider, targetProvider, version, storeConf, confs, hadoopConf)
        catch {
          case e: MigrationException => throw e
          case NonFatal(e) =>
            throw new MigrationException(
              s"$spec (${spec.id(stateRoot).storeCheckpointLocation()}): " +
                s"could not convert version $version from ${short(sourceProvider)} to ${short(targetProvider)}: ${causes(e)}",
              e
            )
        }
      stores.add(entry)
    }
    stagingRoot.foreach { root =>
      val scratch = new Path(root, "scratch")
      scratch.getFileSystem(hadoopConf).delete(scratch, true)
    }
    val out = new JMap[String, AnyRef]()
    out.put("checkpoint", checkpoint)
    out.put("source", sourceProvider)
    out.put("target", targetProvider)
    out.put("version", Long.box(version))
    out.put("staging", stagingRoot.map(r => new Path(r, "state").toString).orNull)
    out.put("stores", stores)
    out
  }

  /** Every store of every operator under `stateRoot`, in operator, store, partition order. */
  def discover(stateRoot: Path, hadoopConf: Configuration): Seq[StoreSpec] = {
    val fs = stateRoot.getFileSystem(hadoopConf)
    if (!fs.exists(stateRoot)) return Nil
    val operators = numericDirs(fs, stateRoot)
    operators.flatMap { op =>
      val opDir = new Path(stateRoot, op.toString)
      if (fs.exists(new Path(opDir, "_metadata/v2"))) {
        throw new IllegalArgumentException(s"operator $op ($opDir) has version 2 operator metadata, which " +
          "only transformWithState writes; heapstate migrate does not convert it")
      }
      val partitions = numericDirs(fs, opDir).map(_.toInt)
      val (name, stores) = operatorMetadata(opDir, hadoopConf) match {
        case Some(m) =>
          (m.operatorInfo.operatorName,
            m.stateStoreInfo.toSeq.map(s => (s.storeName, s.numColsPrefixKey, s.numPartitions)))
        case None =>
          // Checkpoints written before Spark 3.5 have no operator metadata: the store names come
          // from the directories, and no prefix scan is declared (iteration does not need one).
          val first = new Path(opDir, partitions.headOption.getOrElse(0).toString)
          val named = if (fs.exists(first)) fs.listStatus(first).toSeq
            .filter(s => s.isDirectory && !s.getPath.getName.startsWith("_") && !s.getPath.getName.startsWith("."))
            .map(_.getPath.getName).sorted
          else Nil
          ("unknown",
            (if (named.isEmpty) Seq(StateStoreId.DEFAULT_STORE_NAME) else named).map(n => (n, 0, partitions.size)))
      }
      stores.flatMap { case (storeName, prefixCols, numPartitions) =>
        val missing = (0 until numPartitions).filterNot(partitions.contains)
        if (missing.nonEmpty) {
          throw new IllegalArgumentException(s"operator $op ($name) has $numPartitions partitions, but " +
            s"$opDir has no directory for partition(s) ${missing.mkString(", ")}")
        }
        val (keySchema, valueSchema) = schemas(stateRoot, op, storeName, name, hadoopConf)
        (0 until numPartitions).map(p => StoreSpec(op, name, p, storeName, keySchema, valueSchema, prefixCols))
      }
    }
  }

  private def numericDirs(fs: FileSystem, dir: Path): Seq[Long] =
    fs.listStatus(dir).toSeq
      .filter(s => s.isDirectory && s.getPath.getName.nonEmpty && s.getPath.getName.forall(_.isDigit))
      .map(_.getPath.getName.toLong).sorted

  private def operatorMetadata(opDir: Path, hadoopConf: Configuration): Option[OperatorStateMetadataV1] =
    try new OperatorStateMetadataV1Reader(opDir, hadoopConf).read().collect { case m: OperatorStateMetadataV1 => m }
    catch { case _: FileNotFoundException => None }

  /** The key and value schema Spark recorded for a store, in partition 0's `_metadata/schema`. */
  private def schemas(stateRoot: Path, op: Long, storeName: String, opName: String, hadoopConf: Configuration)
      : (StructType, StructType) = {
    val storeDir = StateStoreId(stateRoot.toString, op, 0, storeName).storeCheckpointLocation()
    val file = StateSchemaCompatibilityChecker.schemaFile(storeDir)
    val fs = file.getFileSystem(hadoopConf)
    if (!fs.exists(file)) {
      throw new IllegalArgumentException(s"operator $op ($opName), store $storeName: the state schema file " +
        s"$file is missing; heapstate migrate needs the key and value schemas Spark records there")
    }
    val in = fs.open(file)
    val recorded =
      try StateSchemaCompatibilityChecker.readSchemaFile(in)
      finally in.close()
    val schema = recorded.find(_.colFamilyName == StateStore.DEFAULT_COL_FAMILY_NAME).orElse(recorded.headOption)
      .getOrElse(throw new IllegalArgumentException(s"operator $op ($opName), store $storeName: $file holds no schema"))
    if (recorded.size > 1) {
      throw new IllegalArgumentException(s"operator $op ($opName), store $storeName: $file declares " +
        s"${recorded.size} column families; heapstate migrate converts single-family stores only")
    }
    (schema.keySchema, schema.valueSchema)
  }

  /** The store conf both providers get: the checkpoint's pinned confs, without coordinator calls. */
  private def stateStoreConf(confs: Map[String, String]): StateStoreConf = {
    val sqlConf = new SQLConf
    confs.foreach { case (k, v) => sqlConf.setConfString(k, v) }
    if (sqlConf.getConfString("spark.sql.streaming.stateStore.checkpointFormatVersion", "1") != "1") {
      throw new IllegalArgumentException("the checkpoint uses spark.sql.streaming.stateStore.checkpointFormatVersion=" +
        sqlConf.getConfString("spark.sql.streaming.stateStore.checkpointFormatVersion") + "; heapstate migrate " +
        "converts format 1 only, the only one both providers serve")
    }
    // This tool runs outside any query: nothing to validate commits or snapshot lag against.
    sqlConf.setConfString("spark.sql.streaming.stateStore.commitValidation.enabled", "false")
    sqlConf.setConfString("spark.sql.streaming.stateStore.coordinatorReportSnapshotUploadLag", "false")
    new StateStoreConf(sqlConf, Map.empty)
  }

  private def open(providerClass: String, spec: StoreSpec, root: Path, storeConf: StateStoreConf,
      hadoopConf: Configuration): StateStoreProvider = {
    val loader = Option(Thread.currentThread.getContextClassLoader).getOrElse(getClass.getClassLoader)
    val provider =
      Class.forName(providerClass, true, loader).getDeclaredConstructor().newInstance().asInstanceOf[StateStoreProvider]
    provider.init(spec.id(root), spec.keySchema, spec.valueSchema, spec.encoderSpec, false, storeConf, hadoopConf,
      false, None)
    provider
  }

  /** Reads every row of `version` through `provider`, handing its bytes to `onRow`. */
  private def readAll(provider: StateStoreProvider, version: Long)(
      onRow: (Array[Byte], Array[Byte]) => Unit): ContentDigest = {
    val digest = new ContentDigest
    val store = provider.getReadStore(version, None)
    try {
      val rows = store.iterator()
      try rows.foreach { pair =>
          val k = pair.key.getBytes
          val v = pair.value.getBytes
          digest.add(k, v)
          onRow(k, v)
        }
      finally rows.close()
    } finally store.abort()
    digest
  }

  private def convert(
      spec: StoreSpec,
      stateRoot: Path,
      stagingRoot: Option[Path],
      sourceClass: String,
      targetClass: String,
      version: Long,
      storeConf: StateStoreConf,
      confs: Map[String, String],
      hadoopConf: Configuration): JMap[String, AnyRef] = {
    val sourceDir = spec.id(stateRoot).storeCheckpointLocation()
    val fs = sourceDir.getFileSystem(hadoopConf)
    // The providers create their directory in `init`; a missing one must not be created here.
    if (!fs.exists(sourceDir)) throw new MigrationException(s"$spec: the store directory $sourceDir is missing", null)
    val staged = new JList[AnyRef]()
    val source = open(sourceClass, spec, stateRoot, storeConf, hadoopConf)
    val read =
      try stagingRoot match {
          case None => readAll(source, version)((_, _) => ())
          case Some(root) =>
            val target = new Path(root, "state")
            val file = if (targetClass == HeapProvider) {
              stageHeapstate(spec, source, target, version, confs, hadoopConf)
            } else {
              stageHdfs(spec, source, root, version, storeConf, hadoopConf)
            }
            staged.add(target.toUri.relativize(file._2.toUri).getPath)
            file._1
        }
      finally source.close()
    stagingRoot.foreach { root =>
      val target = open(targetClass, spec, new Path(root, "state"), storeConf, hadoopConf)
      val loaded =
        try readAll(target, version)((_, _) => ())
        finally target.close()
      if (loaded != read) {
        throw new MigrationException(
          s"$spec: the converted state does not match the source: version $version " +
            s"read ${read.rows} rows from ${short(sourceClass)} (digest ${read.hex}) but ${loaded.rows} rows " +
            s"loaded back with ${short(targetClass)} (digest ${loaded.hex}) from ${spec.id(new Path(root, "state")).storeCheckpointLocation()}",
          null
        )
      }
    }
    val out = new JMap[String, AnyRef]()
    out.put("operator", Long.box(spec.operatorId))
    out.put("operatorName", spec.operatorName)
    out.put("partition", Int.box(spec.partition))
    out.put("store", spec.storeName)
    out.put("path", sourceDir.toString)
    out.put("keySchema", spec.keySchema.simpleString)
    out.put("valueSchema", spec.valueSchema.simpleString)
    out.put("numColsPrefixKey", Int.box(spec.numColsPrefixKey))
    out.put("rows", Long.box(read.rows))
    out.put("digest", read.hex)
    out.put("verified", java.lang.Boolean.valueOf(stagingRoot.isDefined))
    out.put("stagedFiles", staged)
    out
  }

  /** Writes `<version>.hs-snapshot` with every row of the source, through heapstate's `io` layer. */
  private def stageHeapstate(
      spec: StoreSpec,
      source: StateStoreProvider,
      target: Path,
      version: Long,
      confs: Map[String, String],
      hadoopConf: Configuration): (ContentDigest, Path) = {
    val files = new StateFiles(spec.id(target).storeCheckpointLocation(), hadoopConf, spec.partition)
    val conf = HeapStateConf(confs)
    var digest: ContentDigest = null
    files.writeSnapshot(version, conf.codec, conf.snapshotBucketBytes,
      dictionaryBytes = heapstate.io.StateFileFormat.DictionaryBytes) { w =>
      digest = readAll(source, version)((k, v) => w.put(k, v))
    }
    (digest, files.snapshotPath(version))
  }

  /**
   * Has the HDFS provider write a snapshot of every row of the source, as version 1 of a scratch
   * store, then renames it to `<version>.snapshot` in the staging state directory. The HDFS
   * provider has no way to start a store at a later version (it refuses `loadEmpty`), and its
   * snapshot files carry no version; the caller loads the renamed file back at `version` with the
   * HDFS provider before it is published.
   */
  private def stageHdfs(
      spec: StoreSpec,
      source: StateStoreProvider,
      stagingRoot: Path,
      version: Long,
      storeConf: StateStoreConf,
      hadoopConf: Configuration): (ContentDigest, Path) = {
    val scratchRoot = new Path(stagingRoot, "scratch")
    val scratch = open(HdfsProvider, spec, scratchRoot, storeConf, hadoopConf)
    val digest =
      try {
        val store = scratch.getStore(0, None, true, false)
        try {
          val d = readAll(source, version)((k, v) =>
            store.put(row(k, spec.keySchema.length), row(v, spec.valueSchema.length)))
          store.commit()
          d
        } finally if (!store.hasCommitted) store.abort()
      } finally scratch.close()
    val built = new Path(spec.id(scratchRoot).storeCheckpointLocation(), "1.snapshot")
    val staged = new Path(spec.id(new Path(stagingRoot, "state")).storeCheckpointLocation(), s"$version.snapshot")
    val fs = staged.getFileSystem(hadoopConf)
    if (!fs.exists(built)) throw new MigrationException(s"$spec: the HDFS provider wrote no snapshot $built", null)
    fs.mkdirs(staged.getParent)
    if (!fs.rename(built, staged)) throw new MigrationException(s"$spec: could not rename $built to $staged", null)
    (digest, staged)
  }

  private def row(bytes: Array[Byte], fields: Int) = {
    val r = new org.apache.spark.sql.catalyst.expressions.UnsafeRow(fields)
    r.pointTo(bytes, bytes.length)
    r
  }

  /** `e` and its causes, outermost first: Spark's load errors keep the file at fault in a cause. */
  private def causes(e: Throwable): String = {
    val chain = Iterator.iterate(e)(_.getCause).takeWhile(_ != null).take(8).toSeq
    chain.map(_.toString).distinct.mkString("; caused by ")
  }

  private def short(provider: String): String = provider.substring(provider.lastIndexOf('.') + 1)

  /**
   * The row count and an order-independent digest of a store's content: the sum, modulo 2^64, of
   * a 64-bit hash of each row's key and value bytes. Equal digests mean equal contents, unless two
   * different sets of rows collide, which a test of this size cannot tell from chance.
   */
  final class ContentDigest {
    var rows = 0L
    private var sum = 0L

    def add(key: Array[Byte], value: Array[Byte]): Unit = {
      val high = MurmurHash3.bytesHash(value, MurmurHash3.bytesHash(key, 0x3c074a61))
      val low = MurmurHash3.bytesHash(value, MurmurHash3.bytesHash(key, 0x7f4a7c15) ^ key.length)
      rows += 1
      sum += (high.toLong << 32) | (low & 0xffffffffL)
    }

    def hex: String = f"$sum%016x"

    override def equals(other: Any): Boolean = other match {
      case d: ContentDigest => d.rows == rows && d.hex == hex
      case _ => false
    }
    override def hashCode: Int = (rows * 31 + sum).hashCode
  }
}
