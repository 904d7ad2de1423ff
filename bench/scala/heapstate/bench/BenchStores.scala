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

  val Providers: Seq[Provider] = Seq(
    Provider("hdfs", "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider", Map.empty),
    Provider("rocksdb", "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
      Map("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled" -> "true")),
    Provider("heapstate", "heapstate.HeapStateStoreProvider", Map.empty))

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
