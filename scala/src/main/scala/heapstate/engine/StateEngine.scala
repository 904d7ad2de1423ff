package heapstate.engine

import java.util.concurrent.locks.ReentrantLock

import org.slf4j.LoggerFactory

import scala.util.control.NonFatal

import heapstate.io.{
  BucketReuse,
  Codec,
  FaultInjection,
  SnapshotBuckets,
  SnapshotFileWriter,
  StateFileException,
  StateFileFormat,
  StateFileWriter,
  StateFiles
}
import heapstate.io.StateFileNames.{Journal, Snapshot, StateFile}

/**
 * What the engine needs to know of the configuration. `snapshotPhase` (0 until
 * `compactionInterval`) is the store's place in the interval: see [[StateEngine.snapshotDueAt]].
 * `bulkLoadSnapshotBytes`: the records a commit onto an empty state must write to be a bulk load
 * ([[CommitResult.bulkLoad]]); 0 turns bulk loads' snapshots off.
 */
final case class EngineSettings(
    compactionInterval: Int,
    codec: Codec,
    undoVersions: Int,
    minVersionsToRetain: Int,
    snapshotBucketBytes: Int,
    snapshotPhase: Int = 0,
    bulkLoadSnapshotBytes: Long = StateEngine.BulkLoadSnapshotBytes,
    /** The zstd dictionary a snapshot's buckets are compressed with (see `SnapshotFileWriter`); 0: none. */
    snapshotDictionaryBytes: Int = heapstate.io.StateFileFormat.DictionaryBytes) {
  require(snapshotPhase >= 0 && snapshotPhase < math.max(compactionInterval, 1), s"a phase in [0, $compactionInterval)")
}

object StateEngine {
  private val running = new java.util.concurrent.atomic.AtomicInteger()

  /**
   * The records (key and value bytes) a commit onto an empty state must leave for its version to
   * be snapshotted at once, on the committing thread ([[CommitResult.bulkLoad]]): 4 MiB. Such a
   * commit (a query's first batch, a backfill) writes every key into its journal anyway, and its
   * snapshot costs about as much again. Written then, in a batch already slowed by loading, it is
   * the base that the first scheduled snapshot copies its untouched buckets from (see
   * [[TouchedBuckets]]); without it, that snapshot compresses every bucket, in the steady batches
   * it overlaps. Smaller states gain too little from copying to pay for a file. The default of
   * `spark.sql.streaming.stateStore.heapstate.bulkLoadSnapshotBytes` ([[EngineSettings]]).
   */
  val BulkLoadSnapshotBytes: Long = 4L << 20

  /**
   * Whether a snapshot is due at `version`, the newest being at `newest`: once the store has reached
   * a version of its `phase` (`phase` plus a multiple of `interval`) at least half an interval
   * after `newest`. A store on its phase snapshots every `interval` versions, at exactly those
   * versions; one off it (after a bulk load, a late snapshot or a restart) gets back on it with one
   * gap of between half and one and a half intervals; a snapshot that cannot start at its version
   * (another is being written, the state is still loading) stays due. Each partition has a phase
   * of its own ([[snapshotPhaseOf]]), so that the stores of a query do not all snapshot in the
   * same batch: with every phase 0, every store's snapshot fell due at once, the snapshot thread
   * wrote them one after another in the batches right after, and those were a W1 run's slowest
   * (stop 49).
   */
  def snapshotDueAt(version: Long, newest: Long, interval: Int, phase: Int): Boolean = {
    val n = math.max(interval, 1).toLong
    val phaseReached = version - Math.floorMod(version - phase, n)
    phaseReached - newest >= (n + 1) / 2
  }

  /**
   * Partition `partition`'s phase in an interval of `interval` versions: the fractional part of
   * `partition` times the golden ratio, scaled, which spreads any number of consecutive partitions
   * evenly (0, 6, 2, 8 for the first four at 10). Partition 0's is 0.
   */
  def snapshotPhaseOf(partition: Int, interval: Int): Int = {
    val golden = 0.6180339887498949
    val frac = partition * golden - math.floor(partition * golden)
    math.min((frac * interval).toInt, math.max(interval - 1, 0))
  }

  /**
   * The snapshot of `state` at `version` (checkpoint id `id`) that an engine wrote or rebuilt
   * from, the length and body checksum it had then, and the buckets commits touched since.
   */
  private final case class ReuseBase(
      state: LiveState,
      version: Long,
      id: Option[String],
      fileBytes: Long,
      bodyCrc: Int,
      touched: TouchedBuckets)

  /**
   * Writes a commit's records to its journal: each of `keys` with its entry in `values`, or its
   * delete where that is a [[Tombstone]].
   *
   * This loop and [[markKeys]]'s are methods of their own, apart from the commit's branches for a
   * commit onto an empty state (its paged records), for the JIT: a commit runs each loop once, so
   * the JIT compiles it from the loop's own count, over several commits. In one method with those
   * branches, a JVM whose profile had not seen them (a query's first batch onto an empty state,
   * after the JVM had warmed up on others) threw the compiled loop away when they came, and the
   * commits after it ran the loop in the JIT's first, slower tier until it had been counted again
   * (W5: four to five batches; stop 75, [[LiveState.prepareCommit]] likewise).
   */
  private def writeRecords(w: StateFileWriter, keys: Array[Key], values: Array[Array[Byte]]): Unit = {
    var i = 0
    while (i < keys.length) {
      if (Tombstone.is(values(i))) w.delete(keys(i).bytes) else w.putEntry(values(i))
      i += 1
    }
  }

  /**
   * Marks the bucket of each of `keys` touched in `base` and in `next`, either of which may be
   * null (see [[writeRecords]]).
   */
  private def markKeys(keys: Array[Key], base: TouchedBuckets, next: TouchedBuckets): Unit = {
    var i = 0
    while (i < keys.length) {
      val hash = keys(i).hashCode
      if (base != null) base.mark(hash)
      if (next != null) next.mark(hash)
      i += 1
    }
  }

  /**
   * How many commits run now, in every store of this JVM; background snapshots wait for them (see
   * [[SnapshotPacer]]). A store's commit counts until its report to Spark's coordinator returns.
   */
  def commitsRunning: Int = running.get

  /** Runs `body` counted in [[commitsRunning]] (counts nest); a `body` that throws is not left counted. */
  def committing[T](body: => T): T = {
    running.incrementAndGet()
    try body
    finally running.decrementAndGet()
  }

  private val writers = new java.util.concurrent.atomic.AtomicInteger()

  /**
   * How many stores of this JVM a task writes now: each from its `getStore` until its commit (and
   * the report to Spark's coordinator) returns, it is aborted, or its task ends. Background
   * snapshots wait for them (see [[SnapshotPacer]]).
   */
  def storesWriting: Int = writers.get

  private val taskCores = new java.util.concurrent.atomic.AtomicInteger()

  /**
   * The cores the tasks running now in this JVM hold (`spark.task.cpus` each), as
   * [[heapstate.TaskActivityPlugin]] counts them; 0 without it.
   */
  def taskCoresInUse: Int = taskCores.get

  /** Counts a task that started, holding `cores`, until [[Counted.close]] (see [[taskCoresInUse]]). */
  def taskStarted(cores: Int): Counted = new Counted(taskCores, cores)

  /** This JVM's processors (`availableProcessors`, which a container's CPU limit caps). */
  private val processors: Int = Runtime.getRuntime.availableProcessors

  /**
   * The executor's cores as [[heapstate.TaskActivityPlugin]] found them when it started, already
   * at most [[processors]] (`TaskActivityPlugin.executorCores`); 0 without it.
   */
  @volatile private var pluginCores = 0

  /** Called by [[heapstate.TaskActivityPlugin]] as its executor starts, with the executor's cores. */
  private[heapstate] def taskPluginStarted(executorCores: Int): Unit = pluginCores = math.max(executorCores, 1)

  /** Called by [[heapstate.TaskActivityPlugin]] as its executor stops. */
  private[heapstate] def taskPluginStopped(): Unit = pluginCores = 0

  /** Whether [[heapstate.TaskActivityPlugin]] counts this JVM's tasks (see [[taskCoresInUse]]). */
  def taskPluginActive: Boolean = pluginCores > 0

  /**
   * The cores the running tasks must hold for a background snapshot to wait: then it could only
   * run on a core a task needs. With fewer held, a core is free (Spark's own threads aside) and
   * it runs, unless a store is written or committed. Waiting whenever any task ran instead gave
   * W1's stores fewer snapshots (README, stop 39).
   *
   * It is the JVM's processors, or the executor's cores when [[heapstate.TaskActivityPlugin]]
   * found fewer (`spark.executor.cores`: an executor that shares a node with others, whose
   * tasks use the other processors). A `local[N]` JVM has the machine to itself: with fewer task
   * slots than processors, its tasks never hold every processor, and a snapshot runs on one of
   * the others.
   */
  private[heapstate] def cores: Int = if (pluginCores > 0) pluginCores else processors

  /**
   * Whether a background snapshot waits now: a task writes a store, a commit runs, or the
   * running tasks hold every core ([[cores]]).
   */
  def tasksBusy: Boolean = busyWith(cores)

  /** [[tasksBusy]] for a JVM of `cores` cores. */
  private[heapstate] def busyWith(cores: Int): Boolean =
    writers.get > 0 || running.get > 0 || taskCores.get >= cores

  /** Counts one store written until [[Counted.close]] (see [[storesWriting]]). */
  def writer(): Counted = new Counted(writers, 1)

  /**
   * `weight` added to one of StateEngine's counts (stores written, task cores held) until `close`,
   * which takes it out once, however often it is called.
   */
  final class Counted private[StateEngine] (count: java.util.concurrent.atomic.AtomicInteger, weight: Int) {
    private val open = new java.util.concurrent.atomic.AtomicBoolean(true)
    count.addAndGet(weight)
    def close(): Unit = if (open.compareAndSet(true, false)) count.addAndGet(-weight)
  }

  /**
   * Lets one paced snapshot write at a time in the JVM, whichever thread runs it. Two threads
   * write snapshots: heapstate's own, which takes each snapshot a commit made due, and Spark's
   * maintenance thread, which takes over a store's snapshot still queued for the first. Each
   * keeps to [[SnapshotPacer.DefaultDutyCycle]] of a core; together they took two thirds, and
   * in W1 on two cores the batches they overlapped took up to 1.7 times the median. Fair, but a
   * waiter queues afresh every 10 ms (when it checks that it is still wanted), so one that came
   * within those 10 ms may go first. Forced snapshots (the task's own, in its commit) do not
   * take it.
   */
  private val snapshotPermit = new java.util.concurrent.Semaphore(1, true)
  private val writing = new java.util.concurrent.atomic.AtomicInteger()
  @volatile private var mostWriting = 0

  /** The most paced snapshots that ever wrote at once in this JVM (tests hold it to 1). */
  private[heapstate] def mostSnapshotsAtOnce: Int = mostWriting

  /**
   * Runs `body` as the one paced snapshot writing in the JVM, once the permit is free; returns
   * None without running it when `stillWanted` is false before it queues (most maintenance runs
   * find nothing due) or turns false while it waits (the store closed, or its snapshot is no
   * longer due), or when the thread is interrupted (Spark stopping its maintenance threads),
   * whose flag it leaves set.
   */
  private[heapstate] def oneSnapshotAtATime[T](stillWanted: () => Boolean)(body: => Option[T]): Option[T] = {
    var permitted = false
    try {
      while (!permitted && stillWanted())
        permitted = snapshotPermit.tryAcquire(10, java.util.concurrent.TimeUnit.MILLISECONDS)
    } catch {
      case _: InterruptedException => Thread.currentThread().interrupt()
    }
    if (!permitted) None
    else
      try {
        val now = writing.incrementAndGet()
        if (now > mostWriting) mostWriting = now
        try body
        finally writing.decrementAndGet()
      } finally snapshotPermit.release()
  }
}

/**
 * What one commit wrote. `id` and `baseId` are the checkpoint ids (format v2) of the new version
 * and of the version it was committed on top of; both `None` in format v1. `bulkLoad`: the commit
 * put at least `bulkLoadSnapshotBytes` ([[EngineSettings]]) onto an empty state with no snapshot (a
 * query's first batch over a large input, a backfill), whose snapshot the committing thread then
 * writes at once (see [[StateEngine.snapshotIfDue]]).
 */
final case class CommitResult(
    version: Long,
    journalBytes: Long,
    keysWritten: Long,
    squashed: Long,
    id: Option[String] = None,
    baseId: Option[String] = None,
    bulkLoad: Boolean = false)

/**
 * The versions of one partition's state: which version the [[LiveState]] holds, how to reach
 * another one (roll back through undo entries, or rebuild from files), commit, snapshot and
 * cleanup. It knows files and bytes, not Spark's operators.
 *
 * Locking: task threads call in under this object's monitor. A snapshot holds `snapshotLock`
 * while it reads the live state, without the monitor; roll-backs and reloads take
 * `snapshotLock` inside the monitor, so they wait for a running snapshot, while commits do not.
 * The monitor is always taken before `snapshotLock`, never the other way round.
 *
 * Checkpoint ids (format v2): every commit may carry a unique id, and a version is then known by
 * its number and its id. Two attempts at one version (a retried or speculative task, a zombie)
 * leave two journals with different ids, and Spark names the one it kept when it asks for the
 * version. `lineageIds` holds the ids of the live state's versions that a roll-back can reach;
 * a request for a version with another id rebuilds it from its own lineage of files. In format
 * v1 every id is `None` and the same code paths apply.
 */
final class StateEngine(
    val files: StateFiles,
    settings: EngineSettings,
    prefixOf: Option[Array[Byte] => Key]) {

  private val log = LoggerFactory.getLogger(classOf[StateEngine])
  private val snapshotLock = new ReentrantLock()

  @volatile private var state: LiveState = _
  /** Version of the newest snapshot known to hold for the current lineage (0: none). */
  @volatile private var newestSnapshot = 0L
  /**
   * Set while a caller waits for `snapshotLock`; a paced snapshot then gives up. One flag is
   * enough: every caller of [[withSnapshotLock]] holds this engine's monitor, so at most one waits.
   */
  @volatile private var snapshotLockWanted = false
  /**
   * Version being snapshotted now, or -1. Set under the monitor; back to -1 only once the
   * snapshot's writer no longer reads the live table. Commits write in place only while it is -1.
   */
  @volatile private var snapshotInProgress = -1L
  /**
   * Reusing buckets: the snapshot the live state last had (the last one this engine wrote, or
   * the one it was rebuilt from), with the buckets that commits (and the journals a rebuild
   * applied on top of it) changed a key of since ([[TouchedBuckets]]). The next snapshot copies the
   * other buckets from that file as stored instead of compressing them again (see
   * [[heapstate.io.SnapshotFileWriter]]). `tracking` is the account begun for the snapshot being
   * written, which becomes the base when that snapshot lands. Every other change to the live
   * state (a roll-back, a fresh state, a re-run, a rebuild, until it names its own base) forgets
   * both: a base always has every change since it counted against it.
   *
   * Viewing the changed buckets only: when the base has the codec and dictionary the next
   * snapshot would have, and the state's records still call for the base's split, the snapshot's
   * view emits the keys of the changed buckets alone, picked by the hash tags in the table's
   * slots, without reading the other keys' bytes, and the writer copies every other bucket from
   * the base (see "Putting the changed buckets only" in [[heapstate.io.SnapshotFileWriter]]).
   * The split is judged from the state's records at the snapshot's version; should the writer's
   * own sum of them call for another (a view may emit a key twice), it refuses, and the snapshot
   * is written again from a view of every key. So it is, warning, and with no bucket copied, when
   * the records the writer copied and was given are not the state's key count at the snapshot's
   * version: the account of the changes is wrong (a mistake of this class's, most likely a
   * change to the table that no commit counted as touching its bucket).
   * Guarded by `reuseLock`, never held while waiting for another lock: commits take it under the
   * monitor, the snapshot thread while it holds `snapshotLock`.
   */
  private val reuseLock = new Object
  private var reuseBase: StateEngine.ReuseBase = null
  private var tracking: TouchedBuckets = null
  private def forgetReuse(): Unit = reuseLock.synchronized { reuseBase = null; tracking = null }
  /** The heap the accounts of touched buckets hold (a few KiB to 128 KiB each; part of `memoryUsedBytes`). */
  def reuseAccountBytes: Long = reuseLock.synchronized {
    (if (reuseBase == null) 0L else reuseBase.touched.heapBytes) + (if (tracking == null) 0L else tracking.heapBytes)
  }
  @volatile private var bucketsReused = 0L
  private val bytesBesideTasks = new java.util.concurrent.atomic.AtomicLong()

  /**
   * Bytes (entries collected, buckets written) of this engine's background snapshots written
   * while the tasks were busy, because the snapshot had used up its budget for waiting for them
   * (see [[SnapshotPacer]]): the snapshot work that competed with the tasks for the cores.
   */
  def snapshotBytesBesideTasks: Long = bytesBesideTasks.get
  /** How many snapshot buckets this engine copied from an earlier snapshot instead of compressing them. */
  def snapshotBucketsReused: Long = bucketsReused
  @volatile private var snapshotsOfChanged = 0L
  /**
   * How many snapshots this engine wrote from a view of the changed buckets' keys alone (see
   * "Viewing the changed buckets only" in the class comment).
   */
  def snapshotsFromChangedBuckets: Long = snapshotsOfChanged
  @volatile private var changedOnlyRefusals, changedOnlyMiscounts = 0L
  /**
   * How many snapshots a writer given the changed buckets' keys alone refused, for another split,
   * codec or dictionary, and a view of every key wrote; and how many it refused because the
   * records did not add up to the state's keys, which a view of every key wrote copying nothing (tests).
   */
  private[heapstate] def snapshotsRefusedChangedOnly: (Long, Long) = (changedOnlyRefusals, changedOnlyMiscounts)
  @volatile private var snapshotListGrowths = 0L
  /** How many times the snapshots this engine wrote grew their lists of entries (see [[SnapshotFileWriter]]; tests). */
  private[heapstate] def snapshotEntryListGrowths: Long = snapshotListGrowths
  /** How many re-run journals the checkpoint manager did not replace (see [[StateFiles.writeJournal]]). */
  def journalsNotReplaced: Long = files.journalsNotReplaced

  /** The highest version seen on disk or committed here; a commit at or below it is a re-run. */
  private var highestKnownVersion = 0L
  /** Checkpoint ids of the live state's version and the versions below it that undo can reach. */
  private val lineageIds = new java.util.TreeMap[java.lang.Long, String]()

  /**
   * Snapshots a rebuild found damaged and skipped. Cleanup never counts one of them as the
   * snapshot a restart starts from, so the older one the rebuild used instead stays.
   */
  private val damagedSnapshots = java.util.concurrent.ConcurrentHashMap.newKeySet[org.apache.hadoop.fs.Path]()

  /**
   * The newest snapshot this engine wrote that no cleanup at a version above it has run after,
   * or -1 ([[cleanupDue]]). Only this engine's own snapshots of the live lineage count: a store
   * that writes none (its files on an instance ahead of it, or snapshots not due) leaves its
   * cleanup to Spark's maintenance, and one whose state moves back below its snapshot (a roll-back,
   * a re-run, a rebuild) forgets it.
   */
  private val uncleanedSnapshot = new java.util.concurrent.atomic.AtomicLong(-1L)
  /** After the live state moves back to `version` (or is replaced: -1), no snapshot above it counts. */
  private def forgetUncleanedAbove(version: Long): Unit =
    uncleanedSnapshot.getAndUpdate(u => if (u > version) -1L else u)
  /** Taken by [[cleanup]]: Spark's maintenance thread and the provider's cleanup thread may both call it. */
  private val cleanupLock = new Object

  /** The version last rebuilt from files, and how long that took. */
  @volatile private var lastLoad: (Long, Long) = (-1L, 0L)

  /** Milliseconds spent rebuilding `version` from files, when it was the last version rebuilt; else 0. */
  def loadMsOf(version: Long): Long = { val (v, ms) = lastLoad; if (v == version) ms else 0L }

  /** The live state's [[LiveState.memoryBytes]] and [[LiveState.memoryBytesRecounted]], for tests. */
  private[heapstate] def memoryAccounts: (Long, Long) =
    synchronized { val st = live; (st.memoryBytes, st.memoryBytesRecounted) }

  /** Whether `version` is the version last rebuilt from files. */
  def rebuiltAt(version: Long): Boolean = lastLoad._1 == version

  /** How many times the live state was rebuilt from files at a version above 0 (a restart, a reload after a failure). */
  def rebuildsFromFiles: Long = rebuilds
  @volatile private var rebuilds = 0L

  def isLoaded: Boolean = state != null
  def live: LiveState = {
    val st = state
    if (st == null) throw new IllegalStateException("no version of this state store is loaded")
    st
  }
  /**
   * Whether a snapshot is due ([[StateEngine.snapshotDueAt]]: every `compactionInterval` versions,
   * at the store's phase), none is being written, and the live state is whole (a state still loading its snapshot's buckets has
   * nothing to gain from a new one).
   */
  def snapshotDue: Boolean = {
    val st = state
    st != null && dueAt(st.version) && snapshotInProgress < 0 && st.isFullyLoaded
  }
  private def dueAt(version: Long): Boolean =
    StateEngine.snapshotDueAt(version, newestSnapshot, settings.compactionInterval, settings.snapshotPhase)
  def snapshotLag: Long = { val st = state; if (st == null) 0 else st.version - newestSnapshot }
  /** Buckets of a snapshot the live state has still to load (0 when it is whole). */
  def bucketsPending: Long = { val st = state; if (st == null) 0 else st.bucketsPending }

  /**
   * Makes the live state hold `version` (with checkpoint id `id`, when given), stepping back or
   * reloading as needed.
   */
  def ensureAt(version: Long, id: Option[String] = None): LiveState = synchronized {
    val st = state
    if (st != null && st.version == version && idMatches(version, id)) {
      st
    } else if (st != null && st.canRollBackTo(version) && idMatches(version, id)) {
      withSnapshotLock {
        forgetReuse()
        st.rollBackTo(version)
        lineageIds.tailMap(version, false).clear()
        if (newestSnapshot > version) newestSnapshot = 0 // that snapshot is of versions being redone
        forgetUncleanedAbove(version)
      }
      st
    } else {
      val started = System.nanoTime()
      withSnapshotLock {
        forgetReuse()
        forgetUncleanedAbove(-1)
        state = null
        lineageIds.clear()
        state = rebuild(version, id)
      }
      val took = System.nanoTime() - started
      lastLoad = (version, took / 1000000)
      if (version > 0) rebuilds += 1 // version 0 is empty: nothing was read
      log.info(f"Loaded version $version of ${files.dir} from files (snapshot $newestSnapshot and the " +
        f"journals above it): ${state.numKeys}%d keys in ${took / 1e6}%.0f ms")
      state
    }
  }

  /** Whether the live lineage's `version` is the one asked for (no id asked: any will do). */
  private def idMatches(version: Long, id: Option[String]): Boolean =
    id.forall(i => version == 0 || lineageIds.get(version) == i)

  /**
   * Commits `changes` on top of `baseVersion` (with checkpoint id `baseId`, when given) as
   * `baseVersion + 1`, with checkpoint id `newId` (format v2) or none (format v1): the journal file
   * first (so a failed write changes nothing in memory), then the live state.
   */
  def commit(
      baseVersion: Long,
      changes: ChangeSet,
      baseId: Option[String] = None,
      newId: Option[String] = None): CommitResult = synchronized {
    StateEngine.committing(commitNow(baseVersion, changes, baseId, newId))
  }

  private def commitNow(
      baseVersion: Long,
      changes: ChangeSet,
      baseId: Option[String],
      newId: Option[String]): CommitResult = {
    val st = ensureAt(baseVersion, baseId)
    val newVersion = baseVersion + 1
    val liveBaseId = if (newId.isDefined) Option(lineageIds.get(baseVersion)) else None
    val fromEmpty = st.numKeys == 0 && newestSnapshot == 0
    // The journal's records come first, from the collected arrays (walking the change set's hash
    // map again would chase one node per key: at a million new keys, about a tenth of a second).
    // The look-ups come after them, and the key delta they find ends the file. Between the
    // look-ups and the changes to the table that reach the same slots and entries (applyCommit)
    // there is then only the file's end (the last of its compression, and its close), instead of
    // all of it: at millions of keys more of those slots and entries are still in the caches and
    // the TLB (W5 at 4M keys: the changes took 0.19 ms of CPU a commit instead of 0.27; stop 52).
    val collected = st.collect(changes)
    var prepared: PreparedCommit = null
    // In format v2 a re-run writes a file of its own id, and no older file describes it.
    val rerun = newId.isEmpty && newVersion <= highestKnownVersion
    val bytes = files.writeJournal(newVersion, settings.codec, newId, liveBaseId, replacing = rerun) { w =>
      StateEngine.writeRecords(w, collected.keys, collected.values)
      if (collected.paged != null) collected.paged.foreach((page, at) => w.putEntry(page, at))
      prepared = st.prepareCommit(collected)
      prepared.keyDelta
    }
    if (rerun) {
      // A re-run of this version: a snapshot left by the earlier run no longer describes it.
      val stale = files.snapshotPath(newVersion)
      forgetReuse()
      if (files.exists(stale)) {
        log.warn(s"Version $newVersion of ${files.dir} was committed again; deleting its old snapshot $stale")
        files.delete(stale)
      }
      if (newestSnapshot >= newVersion) newestSnapshot = 0
      forgetUncleanedAbove(baseVersion)
    }
    highestKnownVersion = math.max(highestKnownVersion, newVersion)
    FaultInjection.pause("published", files.journalPath(newVersion, newId, liveBaseId).toString)
    val byDepth = newVersion - settings.undoVersions
    // Read under the monitor, which starting a snapshot takes too: with none in progress, none can
    // start before this commit ends, so the commit may write same-length updates in place (see
    // LiveState.applyCommit). A snapshot's writer reads the table's bytes until it ends.
    val inProgress = snapshotInProgress
    markTouched(prepared) // before the table changes: a commit that fails half way has touched them too
    val keepUndoAbove = if (inProgress >= 0) math.min(byDepth, inProgress) else byDepth
    try st.applyCommit(prepared, keepUndoAbove, inPlace = inProgress < 0)
    catch { case t: Throwable => dropAfterFailedCommit(newVersion, t) }
    newId.foreach(i => lineageIds.put(newVersion, i))
    // A state still loading its snapshot's buckets loads a share after each commit, except in the
    // batch that rebuilt it from files: that one leaves the cores to the partitions still loading.
    if (!rebuiltAt(baseVersion)) st.loadSome(st.bucketsPerCommit)
    // Ids below the undo depth are no use: those versions are rebuilt from files.
    lineageIds.headMap(byDepth - 1, false).clear()
    val bulkLoad = fromEmpty && settings.bulkLoadSnapshotBytes > 0 && st.recordBytes >= settings.bulkLoadSnapshotBytes
    CommitResult(newVersion, bytes, changes.size, changes.operations - changes.size, newId, liveBaseId, bulkLoad)
  }

  /**
   * After a commit failed while changing the live table (out of memory, say): the table may hold
   * part of it under the base version's number, which a retry (getStore of the base version)
   * would be handed as it is. The live state is dropped instead: the next request rebuilds it from
   * files, and the journal already written makes a retry's commit a re-run.
   */
  private def dropAfterFailedCommit(version: Long, failure: Throwable): Nothing = {
    withSnapshotLock { forgetReuse(); forgetUncleanedAbove(-1); state = null; lineageIds.clear() }
    log.error(
      s"Commit of version $version of ${files.dir} failed while changing the live state; the " +
        "state is dropped, and the next request rebuilds it from files",
      failure
    )
    throw failure
  }

  /** Counts the buckets of the keys `prepared` changes as touched, in the base's account and the one being begun. */
  private def markTouched(prepared: PreparedCommit): Unit = reuseLock.synchronized {
    val base = if (reuseBase == null) null else reuseBase.touched
    val next = tracking
    if (base != null || next != null) {
      StateEngine.markKeys(prepared.keys, base, next)
      if (prepared.paged != null) { // keys moved to pages are not looked at one by one
        if (base != null) base.markAll()
        if (next != null) next.markAll()
      }
    }
  }

  /**
   * Writes a snapshot of the newest committed version when one is due (see
   * [[StateEngine.snapshotDueAt]]; always, when `force`). Returns the version written. Runs on the
   * maintenance thread without blocking commits.
   */
  def snapshotIfDue(force: Boolean = false): Option[Long] =
    if (force) writeSnapshotIfDue(force = true)
    else StateEngine.oneSnapshotAtATime(() => snapshotDue)(writeSnapshotIfDue(force = false))

  private def writeSnapshotIfDue(force: Boolean): Option[Long] = {
    // The version and `snapshotInProgress` are settled under the monitor, which commits hold for
    // their whole length: `s` is a committed version, and no commit drops undo entries above it.
    val picked: Option[(LiveState, Long, Option[String], Option[StateEngine.ReuseBase], TouchedBuckets, Long, Long)] =
      synchronized {
        val st = state
        // Forced snapshots come from the task thread, which may load the rest of the state; the
        // maintenance thread must not, so a background snapshot waits until the state is whole.
        if (force && st != null) st.loadAll()
        val due = st != null && st.version > 0 && st.version != newestSnapshot && st.isFullyLoaded &&
          (force || dueAt(st.version))
        val locked = due && (if (force) { snapshotLock.lock(); true }
                             else snapshotLock.tryLock())
        if (locked) {
          snapshotInProgress = st.version
          // The base's account, as of `s`: no commit runs while the monitor is held.
          val (base, mine) = reuseLock.synchronized {
            val b = reuseBase
            // Nothing to copy from without a local copy off the local disk: no account to keep.
            tracking =
              if (files.mayCopy) TouchedBuckets.forState(st.recordBytes, settings.snapshotBucketBytes) else null
            val usable = b != null && (b.state eq st) && b.version == newestSnapshot && b.version < st.version
            (if (usable) Some(b.copy(touched = b.touched.copy())) else None, tracking)
          }
          Some((st, st.version, Option(lineageIds.get(st.version)), base, mine, st.numKeys, st.recordBytes))
        } else None
      }
    picked.flatMap { case (st, s, id, base, mine, keys, recordBytes) =>
      var from: Option[SnapshotBuckets] = None
      try {
        val started = System.nanoTime()
        from = base.flatMap(openReuseBase)
        val pace: Int => Unit =
          if (force) _ => ()
          else
            new SnapshotPacer(SnapshotPacer.DefaultDutyCycle, () => snapshotLockWanted,
              besideTasks = n => bytesBesideTasks.addAndGet(n)).wrote
        var writer: SnapshotFileWriter = null
        def write(reuse: BucketReuse, only: BucketSet): Long = {
          // The view emits each key of version `s` once, and rarely one a commit changes meanwhile
          // twice; of the buckets in `only` alone, about their share of the keys.
          val share = if (only == null) keys else keys * only.size / (1L << only.bits) + (keys >>> 4) + 1024
          val expected = math.min(share + (keys >>> 6) + 16, Int.MaxValue - 8L).toInt
          files.writeSnapshot(s, settings.codec, settings.snapshotBucketBytes, id, pace, reuse, keepCopy = true,
            expectedEntries = expected, dictionaryBytes = settings.snapshotDictionaryBytes) { w =>
            writer = w
            st.writeSnapshotView(s, w.putEntry(_, _, _), only)
          }
        }
        def copyFailed(e: BucketReuse.CopyFailed): Long = {
          log.warn(s"Could not copy buckets of snapshot ${base.get.version} of ${files.dir}; writing the " +
            s"snapshot of version $s afresh: ${e.getMessage}")
          write(null, null)
        }
        def everyKey(): Long =
          try write(from.map(b => new BucketReuse(b, base.get.touched.untouched)).orNull, null)
          catch { case e: BucketReuse.CopyFailed => copyFailed(e) }
        val only = from.flatMap(b => changedBuckets(b, base.get.touched, recordBytes))
        val bytes = only match {
          case Some(changed) =>
            try {
              val reuse = new BucketReuse(from.get, base.get.touched.untouched, onlyChanged = true, keyCount = keys)
              val bytes = write(reuse, changed)
              snapshotsOfChanged += 1
              bytes
            } catch {
              case e: BucketReuse.ChangedOnlyRefused if e.miscounted =>
                // The account of the changes is wrong: no bucket is copied on its word.
                log.warn(s"Writing the snapshot of version $s of ${files.dir} from every key, copying no bucket " +
                  s"of snapshot ${base.get.version}: ${e.getMessage}")
                changedOnlyMiscounts += 1
                write(null, null)
              case e: BucketReuse.ChangedOnlyRefused =>
                log.info(s"Writing the snapshot of version $s of ${files.dir} from every key: ${e.getMessage}")
                changedOnlyRefusals += 1
                everyKey()
              case e: BucketReuse.CopyFailed => copyFailed(e)
            }
          case None => everyKey()
        }
        newestSnapshot = math.max(newestSnapshot, s)
        uncleanedSnapshot.accumulateAndGet(s, (a, b) => math.max(a, b))
        bucketsReused += writer.reused
        snapshotListGrowths += writer.growths
        reuseLock.synchronized {
          if (mine != null && (tracking eq mine)) {
            reuseBase = StateEngine.ReuseBase(st, s, id, bytes, writer.bodyCrc, mine); tracking = null
          }
        }
        log.info(f"Wrote snapshot of version $s for ${files.dir}: $bytes%d bytes in " +
          f"${(System.nanoTime() - started) / 1e6}%.0f ms, ${writer.reused}%d of ${writer.bucketCount}%d buckets " +
          (if (writer.reused > 0) s"copied from version ${base.get.version}" else "copied") +
          (if (writer.dictionary == null) ""
           else if (writer.trained) ", with a dictionary trained for it"
           else ", with its base's dictionary"))
        Some(s)
      } catch {
        case _: SnapshotPacer.Abandoned =>
          log.info(s"Abandoned the snapshot of version $s for ${files.dir}: a task or close needs the state; " +
            "the next commit or maintenance run starts it again")
          None
      } finally {
        from.foreach(_.close())
        reuseLock.synchronized { if (tracking eq mine) tracking = null }
        try retainCopyOfBase()
        catch { case NonFatal(e) => log.warn(s"Could not delete old local copies of snapshots of ${files.dir}: $e") }
        snapshotInProgress = -1
        snapshotLock.unlock()
      }
    }
  }

  /**
   * The buckets of `from`'s split that commits changed a key of since it (`touched`), when the
   * next snapshot can view the keys of those alone and copy the others from `from` (see "Viewing
   * the changed buckets only" in the class comment): `from` has the codec and dictionary the
   * snapshot would have, the state's `recordBytes` at the snapshot's version call for its split,
   * and `touched` counted the changes key by key, on a split as fine. `None` otherwise: the view
   * then emits every key.
   */
  private def changedBuckets(from: SnapshotBuckets, touched: TouchedBuckets, recordBytes: Long): Option[BucketSet] = {
    val fits = SnapshotFileWriter.compressesAs(from, settings.codec, settings.snapshotDictionaryBytes) &&
      !touched.markedAll && touched.bits >= from.bucketBits &&
      StateFileFormat.bucketBitsFor(recordBytes, settings.snapshotBucketBytes) == from.bucketBits
    if (fits) Some(touched.touchedAt(from.bucketBits)) else None
  }

  /**
   * Opens the snapshot `base` names, mapped, to copy its unchanged buckets: on the local disk the
   * file itself, elsewhere its local copy (see [[StateFiles.openCopy]]). `None` when it is gone,
   * damaged or not the file this engine wrote or read (its length or body checksum differs:
   * another attempt at the version replaced it): the snapshot is then compressed whole, as
   * without a base.
   */
  private def openReuseBase(base: StateEngine.ReuseBase): Option[SnapshotBuckets] = {
    def ours(f: StateFile) =
      f.kind == Snapshot && f.version == base.version && f.id == base.id && f.length == base.fileBytes
    def same(b: SnapshotBuckets) = b.bodyCrc == base.bodyCrc || { b.close(); false }
    try {
      val opened =
        if (files.isLocal) files.list().find(ours).flatMap(files.openSnapshot)
        else files.openCopy(base.version, base.id, base.fileBytes)
      opened.filter(same)
    } catch {
      case NonFatal(e) =>
        log.warn(s"Could not open snapshot ${base.version} of ${files.dir} to copy its unchanged buckets; " +
          s"compressing every bucket of the next one: $e")
        None
    }
  }

  /**
   * Off the local disk, deletes the local copies of snapshots (see [[StateFiles.openCopy]]) but
   * the base's, which the next snapshot copies from. Called holding `snapshotLock`: no snapshot
   * is being written, and no rebuild is making a copy.
   */
  private def retainCopyOfBase(): Unit = if (!files.isLocal) {
    val b = reuseLock.synchronized(reuseBase)
    files.retainCopy(Option(b).map(b => (b.version, b.id)))
  }

  /**
   * Whether a snapshot this engine wrote is below the live version, and no cleanup ran since at a
   * version above it: then [[cleanup]] has snapshots to thin (the ones before it, down to the chain
   * it keeps), and the provider runs it on its cleanup thread instead of waiting for Spark's
   * maintenance.
   *
   * Spark's maintenance runs every 60 s by default, while a snapshot falls due every
   * `compactionInterval` versions: with batches of a few seconds, a store kept every snapshot of
   * the last minute (W1 with maintenance every 5 s: up to eleven of 38 MB in four stores, and
   * the checkpoint's size at the end of a run was its timing's). After each snapshot, a store
   * keeps what a cleanup keeps (the base, a chain of snapshots at most [[thinningGap]] apart, the
   * restart's snapshot) and at most the one newer snapshot at the live version. In W1 (every
   * version retained, the journals reaching the empty version 0, which is closer to the restart's
   * snapshot than the gap) that is one snapshot, two for a batch. The base a cleanup picks is then
   * a snapshot of the chain earlier ones kept, not the newest of every snapshot ever written, so
   * it advances in steps of up to the gap: more journals than one cleanup over every snapshot
   * would keep, within the same bound (see [[cleanup]]).
   */
  def cleanupDue: Boolean = {
    val st = state
    val uncleaned = uncleanedSnapshot.get
    st != null && uncleaned >= 0 && st.version > uncleaned
  }

  /**
   * The widest gap between the snapshots cleanup keeps below the newest: half the retained
   * versions, and never less than `compactionInterval` (which thins nothing, since snapshots are at
   * least that far apart). With Spark's defaults (100 retained, compaction every 10) a store keeps
   * four or five snapshots instead of about eleven, and up to 149 journals instead of 109.
   */
  private def thinningGap: Long = math.max(settings.compactionInterval.toLong, settings.minVersionsToRetain / 2L)

  /**
   * Deletes files that no retained version needs. The newest `minVersionsToRetain` versions up to
   * the live one (and at least the one before it, which a re-run of the last batch starts from)
   * stay recoverable: the newest snapshot of the live lineage at or below the oldest
   * of them (the base) is kept, with every journal above it; everything older goes. In format v2,
   * files of abandoned attempts above that snapshot wait until they fall below a later one.
   *
   * Snapshots between the base and the newest one below the live version are thinned too: every
   * version between them is rebuilt from an older snapshot and the journals, which stay. What
   * stays is the base, the newest snapshot a restart or a re-run of the last batch starts from (at
   * or below the live version minus one), any above it, and between those a chain with no gap
   * wider than [[thinningGap]] versions: each later base is one of those, so the base keeps
   * advancing and a store keeps about `minVersionsToRetain - 1 + thinningGap` journals at most.
   * Without this, a store that snapshots every `compactionInterval` versions keeps
   * `minVersionsToRetain / compactionInterval + 1` snapshots (about eleven with Spark's defaults)
   * that only a request for an older version would use. Two cases delete none of them: files
   * above the live version (another instance of the store, on another executor, may be ahead, and
   * one of these snapshots may be its base), and a snapshot this engine found damaged is never the
   * one kept for restarts.
   */
  def cleanup(): Seq[StateFile] = cleanupLock.synchronized {
    val (st, latest, liveId) =
      synchronized {
        val s = state; if (s == null) (s, 0L, None) else (s, s.version, Option(lineageIds.get(s.version)))
      }
    if (st == null) return Nil
    // A snapshot of the live version itself is not yet a restart's start (see restartFrom below):
    // the cleanup that lets the snapshot before it go is one at a later version.
    val uncleaned = uncleanedSnapshot.get
    if (uncleaned >= 0 && uncleaned < latest) uncleanedSnapshot.compareAndSet(uncleaned, -1L)
    val all = files.list()
    if (all.isEmpty) return Nil
    // Count from the live version, not the highest file: after a re-run, higher files belong to
    // an abandoned lineage and must not push the retained window past versions still needed. The
    // version before the live one stays whatever minBatchesToRetain says (1 included): a re-run of
    // the last batch starts from it (HDFS's provider keeps one version more than asked).
    val oldestRetained = math.min(latest - settings.minVersionsToRetain + 1, latest - 1)
    val walk = Lineage.walk(all, latest, liveId)
    // Neither the base nor the restart's start is ever a snapshot a rebuild found damaged: with it
    // as the base, the files below it would go, the older snapshot the rebuild used in its place
    // among them, and the versions above it with them.
    val trusted = walk.snapshots.filterNot(s => damagedSnapshots.contains(s.path))
    val base = trusted.filter(_.version <= oldestRetained).map(_.version).maxOption
    val below = base.toSeq.flatMap(b => all.filter(f => f.version < b || (f.kind == Journal && f.version == b)))
    // The oldest version the lineage's files rebuild from: the base, the empty version 0 when the
    // journals reach it, or else the oldest snapshot not found damaged where the journals stop (a
    // damaged one rebuilds nothing, and the snapshots above it would be thinned as if it did).
    val floor = base.orElse(if (walk.reachedZero) Some(0L) else trusted.map(_.version).minOption)
    val restartFrom = trusted.filter(_.version < latest).map(_.version).maxOption
    val between = (floor, restartFrom) match {
      case (Some(f), Some(r)) if !all.exists(_.version > latest) =>
        val candidates = walk.snapshots.filter(s => s.version > f && s.version < r).sortBy(_.version)
        // From the floor up, keep the farthest snapshot within the gap (or the nearest beyond it).
        // `above` holds the candidates above `at`, in order, so each step is one span over them.
        val chain = scala.collection.mutable.Set.empty[Long]
        var at = f
        var above = candidates.map(_.version)
        while (r - at > thinningGap && above.nonEmpty) {
          val (within, beyond) = above.span(_ <= at + thinningGap)
          at = if (within.nonEmpty) within.last else beyond.head
          chain += at
          above = if (within.nonEmpty) beyond else beyond.tail
        }
        candidates.filterNot(s => chain.contains(s.version))
      case _ => Nil
    }
    val doomed = below ++ between
    doomed.foreach(f => files.delete(f.path))
    if (below.nonEmpty) log.info(s"Deleted ${below.size} files below version ${base.get} in ${files.dir}")
    if (between.nonEmpty) {
      log.info(s"Deleted ${between.size} snapshots between versions ${floor.get} and ${restartFrom.get} in " +
        s"${files.dir} (versions ${between.map(_.version).mkString(", ")}): older snapshots kept and the journals " +
        "rebuild what they held")
    }
    doomed
  }

  /**
   * Builds the state at `endVersion` (checkpoint id `endId`, when given) from the snapshot at
   * exactly `snapshotVersion` (checkpoint id `snapshotId`, when given).
   */
  def rebuildFromSnapshot(
      snapshotVersion: Long,
      endVersion: Long,
      snapshotId: Option[String] = None,
      endId: Option[String] = None): LiveState = synchronized {
    val all = files.list()
    val chain = journalChain(all, snapshotVersion + 1, endVersion, endId)
    // The lineage below the first journal names the snapshot's id, unless there is no journal.
    val lineageSnapshotId = chain.headOption.map(_.base).getOrElse(endId)
    if (snapshotId.isDefined && lineageSnapshotId.isDefined && snapshotId != lineageSnapshotId && snapshotVersion > 0) {
      throw new StateFileException(
        files.snapshotPath(snapshotVersion, snapshotId),
        snapshotVersion,
        s"version $endVersion (checkpoint id ${endId.getOrElse("none")}) does not descend from it: its lineage " +
          s"passes version $snapshotVersion with checkpoint id ${lineageSnapshotId.get}"
      )
    }
    val wantedId = snapshotId.orElse(lineageSnapshotId)
    val st =
      if (snapshotVersion == 0) new LiveState(prefixOf, 0)
      else {
        val snap =
          all.find(f => f.kind == Snapshot && f.version == snapshotVersion && (wantedId.isEmpty || f.id == wantedId))
            .getOrElse {
              throw new StateFileException(files.snapshotPath(snapshotVersion, wantedId), snapshotVersion,
                "there is no heapstate snapshot at this version to start from")
            }
        openSnapshot(snap, keepCopy = false)._1 // read whole below: no buckets to copy or load later
      }
    chain.foreach(j => applyJournal(st, j))
    st.loadAll() // replayed state serves Spark's state reader, which reads it whole
    st.version = endVersion
    withSnapshotLock {
      forgetReuse()
      state = st; newestSnapshot = snapshotVersion
      highestKnownVersion = all.map(_.version).maxOption.getOrElse(0L)
      lineageIds.clear(); chain.lastOption.flatMap(_.id).orElse(endId).foreach(i => lineageIds.put(endVersion, i))
    }
    st
  }

  /**
   * The journals of versions `from` to `to` on the lineage of version `to` (checkpoint id `toId`,
   * when given), oldest first; an error names the first one missing.
   */
  def journalChain(from: Long, to: Long, toId: Option[String]): Seq[StateFile] =
    journalChain(files.list(), from, to, toId)

  private def journalChain(all: Seq[StateFile], from: Long, to: Long, toId: Option[String]): Seq[StateFile] = {
    val walk = Lineage.walk(all, to, resolveId(all, to, toId), stopAt = from)
    if (walk.journals.length < to - from + 1) {
      throw StateFiles.missingJournal(files.dir, walk.missing.getOrElse(from), walk.missingId)
    }
    walk.journals.reverse
  }

  def close(): Unit = synchronized {
    withSnapshotLock {
      forgetReuse(); forgetUncleanedAbove(-1); state = null; lineageIds.clear()
      files.deleteCopies()
    }
  }

  /**
   * Runs `body` holding `snapshotLock`. When a snapshot holds it, a paced (background) one gives
   * up at its next pause rather than make a task or close wait for it; a forced one is waited for.
   */
  private def withSnapshotLock[T](body: => T): T = {
    if (!snapshotLock.tryLock()) {
      snapshotLockWanted = true
      try snapshotLock.lock()
      finally snapshotLockWanted = false
    }
    try body
    finally snapshotLock.unlock()
  }

  /**
   * The checkpoint id to recover `version` with: `id` when given; else, in format v2 (files with
   * ids), the only id any file of that version has, and an error naming the version when there
   * are several; `None` in format v1.
   */
  private def resolveId(all: Seq[StateFile], version: Long, id: Option[String]): Option[String] = id.orElse {
    val ids = all.filter(_.version == version).flatMap(_.id).distinct
    if (ids.length > 1) {
      throw new StateFileException(
        files.journalPath(version),
        version,
        s"Spark asked for this version without a " +
          s"checkpoint id, and ${ids.length} attempts committed it (ids ${ids.mkString(", ")}); heapstate cannot tell " +
          "which one Spark kept"
      )
    }
    ids.headOption
  }

  /**
   * Rebuilds `version` from the newest usable snapshot on its lineage at or below it, plus the
   * journals above. A damaged snapshot is skipped, with a warning naming it, in favour of an
   * older one; a missing or damaged journal that every candidate needs is an error naming that
   * journal.
   */
  private def rebuild(version: Long, id: Option[String]): LiveState = {
    val all = files.list()
    highestKnownVersion = math.max(highestKnownVersion, all.map(_.version).maxOption.getOrElse(0L))
    if (version == 0) { newestSnapshot = 0; return new LiveState(prefixOf, 0) }
    val wanted = resolveId(all, version, id)
    val walk = Lineage.walk(all, version, wanted)
    // Newest first; the empty state of version 0 is the last resort when the journals reach it.
    val candidates: Seq[Option[StateFile]] = walk.snapshots.map(Some(_)) ++ (if (walk.reachedZero) Seq(None) else Nil)
    var skipped: StateFileException = null
    for (candidate <- candidates) {
      val from = candidate.map(_.version).getOrElse(0L)
      // The state, and whether a local copy of its snapshot was kept (off the local disk).
      val opened: Option[(LiveState, Boolean)] = candidate match {
        case None => Some((new LiveState(prefixOf, 0), false))
        case Some(snap) =>
          try Some(openSnapshot(snap, keepCopy = true))
          catch {
            case e: StateFileException =>
              log.warn(s"Skipping damaged snapshot ${snap.path} (version ${snap.version}) of ${files.dir}; " +
                s"rebuilding version $version from an older snapshot and journals: ${e.getMessage}")
              if (skipped == null) skipped = e else skipped.addSuppressed(e)
              damagedSnapshots.add(snap.path)
              None
          }
      }
      opened match {
        case Some((st, copied)) =>
          // The snapshot is the next one's base (see `reuseBase`), with the keys of the journals
          // above it counted as touched: a restart's first snapshot copies what they left alone.
          val loading = st.loadingSnapshot // before the journals, which may load every bucket
          val touched =
            if (loading == null || !(files.isLocal || copied)) null
            else new TouchedBuckets(math.min(StateFileFormat.MaxBucketBits, loading.bucketBits + 1))
          walk.journals.takeWhile(_.version > from).reverse.foreach(j => applyJournal(st, j, touched))
          st.version = version
          newestSnapshot = from
          wanted.foreach(i => lineageIds.put(version, i))
          if (touched != null) {
            val snap = candidate.get
            reuseLock.synchronized {
              reuseBase = StateEngine.ReuseBase(st, from, snap.id, snap.length, loading.bodyCrc, touched)
            }
          }
          retainCopyOfBase()
          return st
        case None =>
      }
    }
    val missing = walk.missing.getOrElse(1L)
    // Every older candidate needed the missing journal. If a newer snapshot was skipped as
    // damaged, that snapshot is the file at fault: name it, not the long-deleted journal.
    throw (
      if (skipped == null) StateFiles.missingJournal(files.dir, missing, walk.missingId)
      else new StateFileException(
        skipped.path,
        skipped.version,
        s"it is damaged, and no older snapshot with journals can rebuild version $version " +
          s"(journal $missing is gone): ${skipped.getMessage}",
        skipped
      ))
  }

  /**
   * A state at the version of snapshot `file`: a bucketed snapshot (format 2) is checked whole
   * and loaded bucket by bucket as keys are asked for; a format-1 snapshot is read whole now.
   * With `keepCopy`, off the local disk, a bucketed snapshot is loaded from a local copy when one
   * can be made (see [[StateFiles.openSnapshotKeepingCopy]]); the second value says whether one
   * was. Called holding `snapshotLock` then (see [[retainCopyOfBase]]).
   */
  private def openSnapshot(file: StateFile, keepCopy: Boolean): (LiveState, Boolean) = {
    val (opened, copied) =
      if (files.isLocal || !keepCopy) (files.openSnapshot(file), false) else files.openSnapshotKeepingCopy(file)
    opened match {
      case Some(buckets) =>
        val st = new LiveState(prefixOf, file.version, expectedKeys = math.min(buckets.keyCount, 1L << 29).toInt)
        st.beginLazy(buckets)
        (st, copied)
      case None =>
        val st = new LiveState(prefixOf, file.version)
        files.readEntries(file)(
          st.loadEntry,
          _ => throw new StateFileException(file.path, file.version, "a snapshot holds a delete record"))
        (st, false)
    }
  }

  /** Applies the journal `file` to `st`, counting its keys in `touched` when given. */
  private def applyJournal(st: LiveState, file: StateFile, touched: TouchedBuckets = null): Unit =
    if (touched == null) st.journalLoaded(files.readEntries(file)(st.loadEntry, st.loadDelete).keyDelta)
    else {
      val summary = files.readEntries(file)(
        entry => { touched.mark(Entry.keyHash(entry)); st.loadEntry(entry) },
        key => {
          touched.mark(Key.hash(key, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET, key.length))
          st.loadDelete(key)
        }
      )
      st.journalLoaded(summary.keyDelta)
    }
}

/**
 * The files one version's lineage can be rebuilt from: walking down from version `top` (with
 * checkpoint id `topId`), each journal names the id of the version below it.
 *
 * @param journals  the lineage's journals from `top` down, as far as they go unbroken
 * @param snapshots the lineage's snapshots met on the way (at `top` and at the versions the
 *                  journals reach), newest first
 * @param missing   the version whose journal broke the walk, if it stopped above version 0
 * @param missingId that version's checkpoint id, as far as the lineage says
 */
private final case class Lineage(
    journals: Seq[StateFile],
    snapshots: Seq[StateFile],
    missing: Option[Long],
    missingId: Option[String]) {
  def reachedZero: Boolean = missing.isEmpty
}

private object Lineage {
  /** Walks down from `top` until a journal is missing or version `stopAt` has been passed. */
  def walk(all: Seq[StateFile], top: Long, topId: Option[String], stopAt: Long = 1): Lineage = {
    val journals = all.filter(_.kind == Journal).map(f => (f.version, f.id) -> f).toMap
    val snapshots = all.filter(_.kind == Snapshot).map(f => (f.version, f.id) -> f).toMap
    val chain = Seq.newBuilder[StateFile]
    val snaps = Seq.newBuilder[StateFile]
    var v = top
    var id = topId
    var missing: Option[Long] = None
    while (v >= stopAt && v > 0 && missing.isEmpty) {
      snapshots.get((v, id)).foreach(snaps += _)
      journals.get((v, id)) match {
        case Some(j) => chain += j; id = j.base; v -= 1
        case None => missing = Some(v)
      }
    }
    if (missing.isEmpty && v > 0) snapshots.get((v, id)).foreach(snaps += _)
    Lineage(chain.result(), snaps.result(), missing.orElse(if (v > 0) Some(v) else None), id)
  }
}
