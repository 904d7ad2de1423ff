package heapstate

import heapstate.engine.StateEngine
import heapstate.io.Codec

/**
 * Every heapstate configuration key, its default and its validation. Keys live under
 * `spark.sql.streaming.stateStore.heapstate.`; an unknown key under that prefix is an error too,
 * since a misspelt key that is silently ignored is a setting the user believes in but does not
 * have.
 */
final case class HeapStateConf(
    compactionInterval: Int,
    codec: Codec,
    undoVersions: Int,
    snapshotBucketBytes: Int,
    bulkLoadSnapshotBytes: Int,
    localCopyDirs: Option[Seq[java.io.File]])

object HeapStateConf {
  val Prefix = "spark.sql.streaming.stateStore.heapstate."

  final case class Entry(name: String, default: String, allowed: String, doc: String) {
    def key: String = Prefix + name
  }

  val CompactionInterval: Entry = Entry(
    "compactionInterval",
    "10",
    "an integer >= 1",
    "Write a full snapshot every this many versions (each partition at versions of its own phase in the interval)."
  )
  val CompressionCodec: Entry = Entry(
    "compressionCodec",
    "zstd",
    Codec.all.map(_.name).mkString("one of ", ", ", ""),
    "Codec for the body of journals and snapshots. Files record their codec; changing it is safe."
  )
  val UndoVersions: Entry = Entry(
    "undoVersions",
    "2",
    "an integer >= 0",
    "How many recent versions the store can step back to in memory (task retries), before it " +
      "must rebuild an older version from files."
  )

  val SnapshotBucketBytes: Entry = Entry(
    "snapshotBucketBytes",
    "1024",
    "an integer from 64 to 16777216",
    "Bytes of records (before compression) per bucket of a snapshot. A restart decompresses only " +
      "the buckets of the keys a batch touches, and the rest over the next commits; a snapshot copies " +
      "the buckets no key changed in since the last one from that file instead of compressing them " +
      "again. Smaller buckets load less for the same keys and are unchanged more often; larger ones " +
      "compress better. With zstd, a dictionary trained on the state's own buckets (kept while their " +
      "number holds) makes small buckets compress about as well as large ones."
  )

  val BulkLoadSnapshotBytes: Entry = Entry(
    "bulkLoadSnapshotBytes",
    StateEngine.BulkLoadSnapshotBytes.toString,
    "an integer from 0 to 2147483647 (0: never)",
    "Records (key and value bytes) a commit onto an empty state must write for the committing task " +
      "to write that version's snapshot too, at once: a query's first batch over a large input, or a " +
      "backfill. That batch's commit takes about twice as long; the first scheduled snapshot then " +
      "copies the buckets no later commit changed instead of compressing them all in the steady batches."
  )

  val LocalCopyDir: Entry = Entry(
    "localCopyDir",
    "",
    "empty (Spark's local directories), none, or absolute local paths separated by commas",
    "Where a store whose checkpoint is off the local disk (HDFS, an object store) keeps a copy of its " +
      "newest snapshot, so that the next snapshot copies the buckets no commit changed instead of " +
      "compressing them again, and a restart maps its state's buckets instead of holding them on the " +
      "heap. Empty: the scratch directories of the JVM that runs the store, as Spark chooses them for its " +
      "own (the cluster manager's, else spark.local.dir, else java.io.tmpdir); none: no copies."
  )

  val entries: Seq[Entry] =
    Seq(CompactionInterval, CompressionCodec, UndoVersions, SnapshotBucketBytes, BulkLoadSnapshotBytes, LocalCopyDir)

  /** Reads and validates the heapstate keys among `confs`; throws naming the key at fault. */
  def apply(confs: Map[String, String]): HeapStateConf = {
    confs.keys.filter(_.startsWith(Prefix)).toSeq.sorted.foreach { key =>
      if (!entries.exists(_.key == key)) {
        throw new IllegalArgumentException(s"Unknown heapstate configuration key $key; the keys " +
          s"are ${entries.map(_.key).mkString(", ")}")
      }
    }
    def raw(e: Entry): String = confs.getOrElse(e.key, e.default).trim
    def invalid(e: Entry, value: String) = new IllegalArgumentException(
      s"Invalid value '$value' for ${e.key}: expected ${e.allowed}")
    def int(e: Entry, min: Int, max: Int = Int.MaxValue): Int = {
      val value = raw(e)
      value.toIntOption.filter(v => v >= min && v <= max).getOrElse(throw invalid(e, value))
    }
    val codecName = raw(CompressionCodec)
    val copyDirs = raw(LocalCopyDir) match {
      case "" => None
      case "none" => Some(Nil)
      case value =>
        val dirs = value.split(",", -1).map(_.trim).toSeq // -1: an empty last entry is one too
        if (dirs.exists(d => d.isEmpty || !new java.io.File(d).isAbsolute)) throw invalid(LocalCopyDir, value)
        Some(dirs.map(new java.io.File(_)))
    }
    HeapStateConf(
      compactionInterval = int(CompactionInterval, 1),
      codec = Codec.byName(codecName).getOrElse(throw invalid(CompressionCodec, codecName)),
      undoVersions = int(UndoVersions, 0),
      snapshotBucketBytes = int(SnapshotBucketBytes, 64, 1 << 24),
      bulkLoadSnapshotBytes = int(BulkLoadSnapshotBytes, 0),
      localCopyDirs = copyDirs
    )
  }
}
