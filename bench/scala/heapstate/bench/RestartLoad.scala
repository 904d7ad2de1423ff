package heapstate.bench

import heapstate.bench.BenchStores._

import java.nio.file.{Files, Paths}
import java.util.UUID
import java.util.concurrent.{Callable, Executors}

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

/**
 * W1's restart batch, without a query: how long each provider takes to rebuild W1-shaped state
 * from its files in a fresh JVM and run the first batch's reads and writes on it. W1's restart
 * figure is one whole micro-batch; this isolates the part a provider controls, in about a minute
 * per provider.
 *
 * The state: K keys in 4 partitions, a `long` key, and as value a 256-character random hex
 * string, a flag and a count (what `groupBy(k).agg(last(v), count(*))` keeps). Each provider
 * first builds its checkpoint in one JVM: version 1 with every key, committed with a snapshot
 * (`forceSnapshotOnCommit`), then `--journals` versions of U/4 updates per partition (no snapshot
 * above version 1, so the load reads that snapshot and every journal, as W1's worst store reads
 * a snapshot and up to 10 journals). Then, `--runs` times, a fresh JVM with W1's driver heap flags
 * (`-Xmx6g`, no `-Xms`) writes two small versions on a scratch store (as W1's restart warm-up
 * does: the write path is warm, the load path is not), and runs the restart's first batch on the
 * 4 partitions on two threads, as `local[2]` runs two tasks at once: `getStore`, then a get and a
 * put of each of U/4 keys drawn at random, and the commit. heapstate decompresses a snapshot's
 * buckets as their keys are asked for, so its load is in the gets as much as in `getStore`.
 *
 * {{{
 *   bin/sbt "bench/runMain heapstate.bench.RestartLoad"
 *   bin/sbt "bench/runMain heapstate.bench.RestartLoad --runs 5 --keys 1000000 --journals 9"
 * }}}
 * Prints each run's wall time, the GC pause time inside it, where the partitions spent it
 * (`init` and `getStore`, the gets and puts, the commit; summed over the four, so about twice the
 * wall time), and the median per provider, with its ratio to HDFS's. The providers are HDFS and
 * heapstate unless `--providers` says otherwise.
 *
 * `--stage` stops heapstate's load part of the way, to see where a cold load's time goes:
 *  - `parse` reads every file of the partition (decompressing, checking and parsing it) and drops
 *    each record's entry array;
 *  - `keep` also keeps every entry array, in a list (the cost of holding the state: GC copying
 *    and fresh heap pages), with no hash table;
 *  - `table` keeps every entry in an `EntryTable`, grown from empty as a rebuild grows it, with no
 *    provider, engine or memory accounting; `sized` does the same in a table sized up front for
 *    the partition's keys (what knowing the key count before reading would save);
 *  - `arena` probes a bulk-loading design instead ([[ArenaProbe]]): entries copied into chunks
 *    the size of a G1 region, indexed by (chunk, offset);
 *  - `full`, the default, is the whole first batch: `getStore`, the gets and puts, the commit.
 *    Only `full` applies to HDFS.
 * {{{
 *   bin/sbt "bench/runMain heapstate.bench.RestartLoad --providers heapstate --stage parse --runs 5"
 * }}}
 * `--after N` runs N more batches of the same shape after the first, on the same providers, and
 * prints each one's wall time (heapstate loads a share of its pending buckets in each commit; the
 * median still covers the first batch only).
 *
 * `--again N` (with `--stage full`) then runs the restart's load and reads N more times in the
 * same JVM, warmer each time: new providers (so the state is read from the files again) take
 * `getStore` of the restart's version and as many gets and puts (of other random keys), and abort
 * instead of committing (the first batch wrote the next version). It prints the last one's wall
 * time and phases beside the cold ones: how much of a cold restart is the JVM's warm-up (class
 * loading, the interpreter, the JIT) rather than the reading.
 */
object RestartLoad {
  private val Partitions = 4
  private val keySchema = StructType(Seq(StructField("k", LongType, nullable = false)))
  private val valueSchema =
    StructType(Seq(StructField("v", StringType), StructField("set", BooleanType), StructField("n", LongType)))

  def main(args: Array[String]): Unit = {
    val opts = options(args)
    val keys = opts.getOrElse("keys", "1000000").toInt
    val journals = opts.getOrElse("journals", "9").toInt
    val updates = opts.getOrElse("updates", "10000").toInt
    val runs = opts.getOrElse("runs", "3").toInt
    val after = opts.getOrElse("after", "0").toInt
    val again = opts.getOrElse("again", "0").toInt
    require(
      keys >= Partitions && journals >= 0 && updates >= Partitions && runs >= 1 && after >= 0 && again >= 0,
      s"--keys and --updates must be at least $Partitions, --journals, --after and --again at least 0, --runs at least 1"
    )
    // RocksDB's restart is measured by W1; this probe compares the two heap providers' loads.
    val providers = chosen(opts + ("providers" -> opts.getOrElse("providers", "hdfs,heapstate")))
    val stage = opts.getOrElse("stage", "full")
    require(Stages.contains(stage), s"--stage must be one of ${Stages.mkString(", ")}, not '$stage'")
    require(stage == "full" || again == 0, s"--again times the whole first batch's load; it needs --stage full")
    require(stage == "full" || providers.forall(_.name == "heapstate"),
      s"--stage $stage looks inside heapstate's load; run it with --providers heapstate")
    opts.get("phase") match {
      case Some("build") => build(providers.head, opts("root"), keys, journals, updates)
      case Some("load") =>
        load(providers.head, opts("root"), journals + 1, stage, keys / Partitions, updates, after, again, opts("out"))
      case _ =>
        val root = Files.createTempDirectory("restart-load")
        val walls = mutable.LinkedHashMap.empty[String, Seq[Long]]
        try {
          for (p <- providers) {
            val dir = root.resolve(p.name).toString
            def phase(name: String, heap: Seq[String], checkpoint: String, extra: String*): Unit = {
              val options = Seq(
                "--phase" -> name,
                "--providers" -> p.name,
                "--root" -> checkpoint,
                "--keys" -> keys.toString,
                "--journals" -> journals.toString,
                "--updates" -> updates.toString,
                "--stage" -> stage,
                "--after" -> after.toString,
                "--again" -> again.toString
              )
              val cmd = Seq(javaBin) ++ heap ++ jvmOpens ++
                Seq("-cp", System.getProperty("java.class.path"), "heapstate.bench.RestartLoad") ++
                options.flatMap { case (k, v) => Seq(k, v) } ++ extra
              val code = new ProcessBuilder(cmd: _*).inheritIO().start().waitFor()
              if (code != 0) sys.error(s"the ${p.name} $name phase failed with exit code $code")
            }
            phase("build", Seq("-Xms6g", "-Xmx6g"), dir)
            walls(p.name) = (1 to runs).map { _ =>
              // Each run restarts from its own copy of the checkpoint: a run's commit writes the
              // next version, which must be new to every run, as it is in W1's restarts.
              val copy = root.resolve(s"${p.name}-run")
              org.apache.commons.io.FileUtils.copyDirectory(new java.io.File(dir), copy.toFile)
              val out = Files.createTempFile(root, "load", ".txt")
              try phase("load", Seq("-Xmx6g"), copy.toString, "--out", out.toString)
              finally deleteRecursively(copy.toFile)
              Files.readString(out).trim.toLong
            }
          }
        } finally deleteRecursively(root.toFile)
        report(walls, keys, journals, updates, stage)
    }
  }

  private val Stages = Seq("parse", "keep", "table", "sized", "arena", "full")

  private def report(
      walls: mutable.LinkedHashMap[String, Seq[Long]], keys: Int, journals: Int, updates: Int, stage: String): Unit = {
    println(
      f"%nRestart load: K=$keys%,d in $Partitions partitions, version 1 + $journals journals of $updates%,d updates; " +
        s"fresh JVM, two loading threads" + (if (stage == "full") "" else s"; heapstate's load up to stage '$stage'"))
    val base = walls.get("hdfs").map(ws => median(ws))
    println(f"${"provider"}%-18s ${"median ms"}%10s ${"vs hdfs"}%8s  runs")
    for ((name, ws) <- walls) {
      val m = median(ws)
      val ratio = base.map(b => f"${m.toDouble / b}%.2fx").getOrElse("-")
      println(f"$name%-18s $m%10d $ratio%8s  ${ws.mkString(", ")}")
    }
  }

  private[bench] def open(p: Provider, root: String, partition: Int): StateStoreProvider = {
    val sql = new SQLConf()
    sql.setConfString("spark.sql.streaming.minBatchesToRetain", "100")
    // No snapshot above version 1 for either provider, whatever the timing of a background one.
    sql.setConfString("spark.sql.streaming.stateStore.minDeltasForSnapshot", "1000")
    sql.setConfString("spark.sql.streaming.stateStore.heapstate.compactionInterval", "1000")
    p.confs.foreach { case (k, v) => sql.setConfString(k, v) }
    val conf = new Configuration()
    // As Spark's session does, the SQL settings go into the Hadoop configuration too (the
    // checkpoint file manager's class among them).
    p.confs.foreach { case (k, v) => conf.set(k, v) }
    conf.set("sql.streaming.queryId", UUID.randomUUID().toString)
    conf.set("sql.streaming.runId", UUID.randomUUID().toString)
    val provider = StateStoreProvider.create(p.className)
    provider.init(StateStoreId(root, 0, partition), keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
      false, new StateStoreConf(sql), conf, false, None)
    provider
  }

  // A projection writes every row into one buffer of its own, and the batch runs on two threads:
  // one projection per thread, so the timed batch never waits on a lock to build a row.
  private val keyProj = ThreadLocal.withInitial(() => UnsafeProjection.create(keySchema))
  private val valueProj = ThreadLocal.withInitial(() => UnsafeProjection.create(valueSchema))
  private[bench] def key(k: Long): UnsafeRow = keyProj.get()(InternalRow(k)).copy()
  private[bench] def value(k: Long, version: Int, payload: Int = 256): UnsafeRow = {
    // Random-looking hex, like W1's sha2 payload: it compresses to about half, not to nothing.
    val rnd = new java.util.SplittableRandom(k * 1000003L + version)
    val hex = Array.fill[Byte](payload)("0123456789abcdef".charAt(rnd.nextInt(16)).toByte)
    valueProj.get()(InternalRow(UTF8String.fromBytes(hex), true, version.toLong)).copy()
  }

  private def build(p: Provider, root: String, keys: Int, journals: Int, updates: Int): Unit = {
    val rnd = new java.util.Random(42)
    for (part <- 0 until Partitions) {
      val provider = open(p, root, part)
      val first = provider.getStore(0, None, forceSnapshotOnCommit = true, loadEmpty = false)
      var k = part.toLong
      while (k < keys) { first.put(key(k), value(k, 0)); k += Partitions }
      first.commit()
      for (v <- 1 to journals) {
        val store = provider.getStore(v)
        for (_ <- 0 until updates / Partitions) {
          val kk = rnd.nextInt(keys / Partitions).toLong * Partitions + part
          store.put(key(kk), value(kk, v))
        }
        store.commit()
      }
      provider.close()
    }
    println(s"${p.name}: built $keys keys in $Partitions partitions, versions 1 to ${journals + 1}")
  }

  /**
   * One partition's heapstate files, loaded up to `stage` (see the class comment) by a table
   * sized, where the stage says so, for `keysPerPartition`; returns the records read (`parse`) or
   * the entries kept (the other stages).
   */
  private def loadStage(root: String, part: Int, stage: String, keysPerPartition: Int): Long = {
    import heapstate.engine.{Entry, EntryTable, Key}
    val files = new heapstate.io.StateFiles(new org.apache.hadoop.fs.Path(s"$root/0/$part"), new Configuration(), part)
    var n = 0L
    def each(onEntry: Array[Byte] => Unit, onDelete: Array[Byte] => Unit): Unit =
      files.list().foreach(f => files.readEntries(f)(onEntry, onDelete))
    stage match {
      case "parse" => each(_ => n += 1, _ => n += 1)
      case "keep" =>
        val kept = new java.util.ArrayList[Array[Byte]]()
        each(kept.add(_), _ => ())
        n = kept.size
      case "table" | "sized" =>
        val table = if (stage == "sized") new EntryTable(keysPerPartition) else new EntryTable()
        each(e => table.put(e, Entry.keyHash(e)), k => table.remove(Key(k)))
        n = table.size
      case "arena" =>
        val arena = new ArenaProbe(keysPerPartition)
        each(arena.put, arena.remove)
        n = arena.size
    }
    n
  }

  private def load(
      p: Provider, root: String, version: Int, stage: String, keysPerPartition: Int, updates: Int, after: Int,
      again: Int, out: String): Unit = {
    val scratch = Files.createTempDirectory("restart-load-warm-up")
    val warm = open(p, scratch.toString, 0)
    for (v <- 0 until 2) {
      val store = warm.getStore(v)
      for (k <- 0 until 1000) store.put(key(k), value(k, v))
      store.commit()
    }
    warm.close()
    deleteRecursively(scratch.toFile)
    val pool = Executors.newFixedThreadPool(2)
    // Pauses only: newer JDKs add a bean for G1's concurrent work ("G1 Concurrent GC").
    def gcMs: Long = java.lang.management.ManagementFactory.getGarbageCollectorMXBeans.toArray
      .map(_.asInstanceOf[java.lang.management.GarbageCollectorMXBean])
      .filterNot(_.getName.contains("Concurrent")).map(_.getCollectionTime).sum
    val gcBefore = gcMs
    val start = System.nanoTime()
    val opened = new Array[StateStoreProvider](Partitions)
    // The first batch's time in init and getStore, in the gets and puts, and in commit, summed over partitions.
    val phases = new Array[Long](3)
    // A batch's reads and writes on partition `part`'s `store`: U/4 keys drawn with `seed`, each read
    // first, as an aggregation reads its state, then written with the value of `newVersion`.
    def getsAndPuts(store: StateStore, part: Int, seed: Long, newVersion: Int): Unit = {
      val rnd = new java.util.Random(seed)
      for (_ <- 0 until updates / Partitions) {
        val k = rnd.nextInt(keysPerPartition).toLong * Partitions + part
        require(store.get(key(k)) != null, s"key $k is missing from partition $part")
        store.put(key(k), value(k, newVersion))
      }
    }
    // Batch `b` after the restart (0: the restart's own) on every partition.
    def batch(b: Int): Long = (0 until Partitions).map { part =>
      pool.submit(new Callable[Long] {
        def call(): Long = if (stage != "full") loadStage(root, part, stage, keysPerPartition)
        else {
          val t0 = System.nanoTime()
          if (opened(part) == null) opened(part) = open(p, root, part)
          val store = opened(part).getStore(version + b)
          val t1 = System.nanoTime()
          getsAndPuts(store, part, 1000L * (b + 1) + part, version + b + 1)
          val t2 = System.nanoTime()
          store.commit()
          val t3 = System.nanoTime()
          if (b == 0) phases.synchronized {
            phases(0) += (t1 - t0) / 1000000; phases(1) += (t2 - t1) / 1000000; phases(2) += (t3 - t2) / 1000000
          }
          store.metrics.numKeys
        }
      })
    }.map(_.get()).sum
    // With --again N: the restart's load and reads N more times in this JVM, warmer each time, on
    // new providers (their own engines, so the state is read from the files again), without the
    // commit, whose version the first batch wrote; the last one's phases and wall time.
    val phasesAgain = new Array[Long](2)
    def loadAgain(): Long = {
      java.util.Arrays.fill(phasesAgain, 0L)
      val t = System.nanoTime()
      (0 until Partitions).map { part =>
        pool.submit(new Callable[Unit] {
          def call(): Unit = {
            val t0 = System.nanoTime()
            val provider = open(p, root, part)
            try {
              val store = provider.getStore(version)
              val t1 = System.nanoTime()
              getsAndPuts(store, part, 1L + part, version + 1)
              val t2 = System.nanoTime()
              store.abort()
              phasesAgain.synchronized {
                phasesAgain(0) += (t1 - t0) / 1000000; phasesAgain(1) += (t2 - t1) / 1000000
              }
            } finally provider.close()
          }
        })
      }.foreach(_.get())
      (System.nanoTime() - t) / 1000000
    }
    val (loaded, wall, gc, later, againWall) =
      try {
        val n = batch(0)
        val wall = (System.nanoTime() - start) / 1000000
        val gc = gcMs - gcBefore
        // The batches after it: heapstate loads a share of the buckets still pending in each commit.
        val later = (1 to (if (stage == "full") after else 0)).map { b =>
          val t = System.nanoTime(); batch(b); (System.nanoTime() - t) / 1000000
        }
        val againWall =
          if (again == 0 || stage != "full") None
          else {
            opened.foreach(o => if (o != null) o.close()) // the first batch's providers are done
            (1 to again).map(_ => loadAgain()).lastOption
          }
        (n, wall, gc, later, againWall)
      } finally pool.shutdown() // a failed partition must not leave the pool's threads keeping the JVM alive
    val what = if (stage == "parse") "records" else "keys"
    val did = if (stage == "full") "first batch" else "load"
    println(f"${p.name}%-18s $did wall $wall%5d ms (GC pauses $gc%4d ms), $loaded%,d $what" +
      (if (stage != "full") ""
       else s"; summed over partitions: init and getStore ${phases(0)} ms, gets and puts " +
         s"${phases(1)} ms, commit ${phases(2)} ms") +
      (if (later.isEmpty) "" else s"; the ${later.size} batches after it: ${later.mkString(", ")} ms") +
      againWall.fold("")(w =>
        s"; again ($again times, warmer each time; the last), without the commit: wall $w ms, init and getStore " +
          s"${phasesAgain(0)} ms, gets and puts ${phasesAgain(1)} ms"))
    Files.writeString(Paths.get(out), wall.toString)
  }
}

/**
 * A probe of a bulk-loading design, for `--stage arena`: each entry (`Entry`'s layout) is copied
 * into the current chunk, a byte array one G1 region long less its header. An array that large is
 * humongous: G1 allocates it straight into the old generation and no young collection copies it.
 * An open-addressing index, sized up front as `EntryTable` sizes it, holds each key's hash and a
 * reference: (chunk << 32 | offset) + 1, so that 0 is a never-used slot; -1 marks a removed key.
 * It only loads: enough to time a load, no reads or snapshots.
 */
private final class ArenaProbe(expectedKeys: Int) {
  import org.apache.spark.unsafe.Platform
  import org.apache.spark.unsafe.array.ByteArrayMethods
  import heapstate.engine.Key

  private val chunkBytes = {
    val hotspot = java.lang.management.ManagementFactory.getPlatformMXBean(
      classOf[com.sun.management.HotSpotDiagnosticMXBean])
    (hotspot.getVMOption("G1HeapRegionSize").getValue.toLong - 16).toInt
  }
  private val chunks = mutable.ArrayBuffer(new Array[Byte](chunkBytes))
  private var pos = 0
  private val mask = heapstate.engine.EntryTable.capacityFor(expectedKeys) - 1
  private val refs = new Array[Long](mask + 1)
  private val hashes = new Array[Int](mask + 1)
  var size = 0

  def put(entry: Array[Byte]): Unit = {
    require(entry.length <= chunkBytes, s"an entry of ${entry.length} bytes does not fit a chunk")
    if (pos + entry.length > chunkBytes) { chunks += new Array[Byte](chunkBytes); pos = 0 }
    System.arraycopy(entry, 0, chunks.last, pos, entry.length)
    val ref = (((chunks.length - 1).toLong << 32) | pos) + 1
    pos += entry.length
    val keyLength = Platform.getInt(entry, Platform.BYTE_ARRAY_OFFSET)
    val hash = Key.hash(entry, Platform.BYTE_ARRAY_OFFSET + 4, keyLength)
    var i = hash & mask
    while (refs(i) != 0) {
      if (holds(i, hash, entry, Platform.BYTE_ARRAY_OFFSET + 4, keyLength)) { refs(i) = ref; return }
      i = (i + 1) & mask
    }
    refs(i) = ref; hashes(i) = hash; size += 1
  }

  def remove(key: Array[Byte]): Unit = {
    val hash = Key.hash(key, Platform.BYTE_ARRAY_OFFSET, key.length)
    var i = hash & mask
    while (refs(i) != 0) {
      if (holds(i, hash, key, Platform.BYTE_ARRAY_OFFSET, key.length)) { refs(i) = -1; size -= 1; return }
      i = (i + 1) & mask
    }
  }

  /** Whether slot `i` holds a live entry whose key is the `length` bytes at `base`/`offset`. */
  private def holds(i: Int, hash: Int, base: AnyRef, offset: Long, length: Int): Boolean = refs(i) > 0 &&
    hashes(i) == hash && {
      val r = refs(i) - 1
      val chunk = chunks((r >>> 32).toInt)
      val at = Platform.BYTE_ARRAY_OFFSET + (r & 0xffffffffL)
      Platform.getInt(chunk, at) == length && ByteArrayMethods.arrayEquals(chunk, at + 4, base, offset, length)
    }
}
