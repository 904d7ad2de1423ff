package heapstate

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.spark.{SparkEnv, TaskContext}
import org.apache.spark.sql.catalyst.expressions.{BoundReference, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.StructType
import org.apache.spark.unsafe.Platform
import org.slf4j.LoggerFactory

import heapstate.engine._
import heapstate.io.StateFiles

/**
 * heapstate's `StateStoreProvider`: state on the JVM heap in one live copy per partition, a
 * journal of only the changed keys per batch, and periodic snapshots written off the task thread.
 *
 * This class translates Spark's API and holds no storage logic: rows become [[Key]]s and byte
 * arrays here, the [[StateEngine]] keeps versions, and `heapstate.io` owns the files.
 *
 * Enable it with `spark.sql.streaming.stateStore.providerClass=heapstate.HeapStateStoreProvider`.
 */
class HeapStateStoreProvider extends StateStoreProvider with SupportsFineGrainedReplay {
  import HeapStateStoreProvider._

  private var storeId: StateStoreId = _
  private var storeConf: StateStoreConf = _
  private var hadoopConf: Configuration = _
  private var keySchema: StructType = _
  private var valueSchema: StructType = _
  private var keyFields = 0
  private var valueFields = 0
  /** Checkpoint format v2: every commit gets a unique checkpoint id. */
  private var checkpointIds = false
  @volatile private var engine: StateEngine = _
  /** Changes a store on an empty state holds in a hash map before it moves puts to pages (see `ChangeSet`); tests lower it. */
  @volatile private[heapstate] var changeSetPagesFrom: Int = ChangeSet.PagesFrom
  /** Spark's report of a commit to its state store coordinator; tests put a recorder in its place. */
  private[heapstate] var reportCommit: (Long, StateStoreId, Configuration) => Unit =
    StateStore.reportCommitToCoordinator
  /** The rebuild from files (see [[StateEngine.rebuildsFromFiles]]) whose rows a store has checked. */
  @volatile private var rowsCheckedAfterRebuild = 0L
  /** The snapshot a commit handed to the background thread, until it has run. */
  @volatile private var pendingSnapshot: Background = null
  /** The cleanup a commit handed to the cleanup thread after a snapshot, until it has run. */
  @volatile private var pendingCleanup: Background = null
  /**
   * Whether commits hand a cleanup to the cleanup thread once a snapshot this store wrote is
   * below the live version ([[StateEngine.cleanupDue]]); tests that leave cleanup to maintenance
   * alone turn it off.
   */
  @volatile private[heapstate] var cleanupAfterSnapshots = true

  override def init(
      stateStoreId: StateStoreId,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useColumnFamilies: Boolean,
      storeConfs: StateStoreConf,
      hadoopConf: Configuration,
      useMultipleValuesPerKey: Boolean,
      stateSchemaProvider: Option[StateSchemaProvider]): Unit = {
    val conf = HeapStateConf(storeConfs.sqlConfs ++ storeConfs.extraOptions)
    if (useColumnFamilies) {
      throw new UnsupportedOperationException(s"heapstate does not support column families (state " +
        s"store $stateStoreId): transformWithState and the newer stream-stream join state formats use " +
        "them, which Spark runs on RocksDB only (HDFSBackedStateStoreProvider refuses them too)")
    }
    if (useMultipleValuesPerKey) {
      throw new UnsupportedOperationException(s"heapstate does not support multiple values per " +
        s"key (state store $stateStoreId); that is transformWithState's, which Spark runs on RocksDB only")
    }
    if (storeConfs.stateStoreCheckpointFormatVersion > 2) {
      throw new UnsupportedOperationException("heapstate does not support " +
        s"spark.sql.streaming.stateStore.checkpointFormatVersion=${storeConfs.stateStoreCheckpointFormatVersion} " +
        s"(state store $stateStoreId); use 1 (the default) or 2")
    }
    this.checkpointIds = storeConfs.enableStateStoreCheckpointIds
    this.storeId = stateStoreId
    this.storeConf = storeConfs
    this.hadoopConf = hadoopConf
    this.keySchema = keySchema
    this.valueSchema = valueSchema
    this.keyFields = keySchema.length
    this.valueFields = valueSchema.length
    val prefixOf = keyStateEncoderSpec match {
      case _: NoPrefixKeyStateEncoderSpec => None
      case PrefixKeyScanStateEncoderSpec(_, numColsPrefixKey) =>
        Some(prefixExtractor(keySchema, numColsPrefixKey))
      case other =>
        throw new UnsupportedOperationException(
          s"heapstate does not support the key encoding $other (state store $stateStoreId)")
    }
    val copyRoots = conf.localCopyDirs.getOrElse(
      StateFiles.sparkLocalDirs(key => Option(SparkEnv.get).flatMap(_.conf.getOption(key)), sys.env.get))
    val files =
      new StateFiles(
        stateStoreId.storeCheckpointLocation(),
        hadoopConf,
        stateStoreId.partitionId,
        copyRoots,
        StateFiles.copyNameOf(stateStoreId.operatorId, stateStoreId.partitionId, stateStoreId.storeName)
      )
    val settings = EngineSettings(
      compactionInterval = conf.compactionInterval,
      codec = conf.codec,
      undoVersions = conf.undoVersions,
      minVersionsToRetain = storeConfs.minVersionsToRetain,
      snapshotBucketBytes = conf.snapshotBucketBytes,
      snapshotPhase = StateEngine.snapshotPhaseOf(stateStoreId.partitionId, conf.compactionInterval),
      bulkLoadSnapshotBytes = conf.bulkLoadSnapshotBytes
    )
    engine = new StateEngine(files, settings, prefixOf)
    if (!NoTaskPluginWarned.get) TaskActivityPlugin.missingWarning.foreach { message =>
      if (NoTaskPluginWarned.compareAndSet(false, true)) log.warn(message)
    }
  }

  override def stateStoreId: StateStoreId = storeId

  /** The live state's running memory count and the same counted afresh (tests compare them). */
  private[heapstate] def memoryAccounts: (Long, Long) = engine.memoryAccounts
  /** How many snapshot buckets this provider's store copied instead of compressing (tests). */
  private[heapstate] def snapshotBucketsCopied: Long = engine.snapshotBucketsReused
  /** How many re-run journals the checkpoint manager kept the earlier file of (tests). */
  private[heapstate] def journalsNotReplaced: Long = engine.journalsNotReplaced
  /** The live state at `version`, loaded if need be (benchmarks that time the table alone). */
  private[heapstate] def liveAt(version: Long): LiveState = engine.ensureAt(version)

  override def close(): Unit = if (engine != null) {
    // A queued cleanup never starts, and a running one ends first. (A commit racing the close, a
    // zombie task's, may still queue one; it runs as a maintenance cleanup would, or finds the
    // engine closed and does nothing.)
    cancelOrAwait(pendingCleanup)
    engine.close() // a background snapshot running now gives up at its next pause
    cancelPendingSnapshot() // and a queued one never starts
  }

  override def getStore(
      version: Long,
      uniqueId: Option[String],
      forceSnapshotOnCommit: Boolean,
      loadEmpty: Boolean): StateStore = {
    requireVersion(version); uniqueId.foreach(requireId)
    if (loadEmpty) {
      // A journal records changes, not where they started from: a version begun empty would be
      // rebuilt on top of the files below it. HDFSBackedStateStoreProvider refuses this as well.
      throw new UnsupportedOperationException(s"heapstate does not support loadEmpty (state store " +
        s"$storeId, version $version), which Spark's offline state repartitioning asks for; it " +
        "runs on RocksDB only")
    }
    new HeapStore(version, uniqueId, engine.ensureAt(version, uniqueId), readOnly = false, forceSnapshotOnCommit)
  }

  override def getReadStore(version: Long, uniqueId: Option[String]): ReadStateStore = {
    requireVersion(version); uniqueId.foreach(requireId)
    new HeapStore(version, uniqueId, engine.ensureAt(version, uniqueId), readOnly = true, forceSnapshot = false)
  }

  override def doMaintenance(): Unit = { doSnapshotMaintenance(); doCleanupMaintenance() }

  /**
   * Spark 4.3's maintenance thread calls the two halves separately. A snapshot a commit already
   * started is waited for, one still queued is taken over, so that a due snapshot is on disk when
   * maintenance returns. A snapshot taken over waits while another store's is written: one paced
   * snapshot writes at a time in the JVM (see `StateEngine.oneSnapshotAtATime`).
   */
  override def doSnapshotMaintenance(): Unit = if (engine != null) {
    cancelPendingSnapshot()
    engine.snapshotIfDue().foreach(reportSnapshot)
  }

  /**
   * Hands a due snapshot to the background thread as soon as a commit makes it due, so that
   * `compactionInterval` holds whatever Spark's maintenance interval (60 s by default) is. One
   * thread serves every store in the JVM, and maintenance threads that take a snapshot over wait
   * for the one running: snapshots of several partitions run one after another.
   */
  private def snapshotSoon(): Unit = {
    val pending = pendingSnapshot
    if (engine.snapshotDue && (pending == null || pending.isDone)) {
      val task = new Background(
        () => engine.snapshotIfDue().foreach(reportSnapshot),
        "background snapshot",
        "its journals still hold every version, and the next commit or maintenance run tries again"
      )
      pendingSnapshot = task
      SnapshotThread.execute(task)
    }
  }

  /**
   * Hands a cleanup to the cleanup thread once a snapshot this store wrote is below the live
   * version (see [[StateEngine.cleanupDue]]), so that the snapshots it makes unneeded go within a
   * batch or two instead of at Spark's next maintenance run. A listing of the store's directory
   * and a few deletes, it takes no pacing, and has a thread of its own so as not to wait behind
   * the paced snapshots of other stores (several batches each, in W1).
   */
  private def cleanupSoon(): Unit = {
    val pending = pendingCleanup
    if (cleanupAfterSnapshots && engine.cleanupDue && (pending == null || pending.isDone)) {
      val task = new Background(
        () => if (engine.isLoaded) engine.cleanup(),
        "cleanup after a snapshot", "its files stay until the next cleanup")
      pendingCleanup = task
      CleanupThread.execute(task)
    }
  }

  /** Waits until the background threads have run everything handed to them before the call (tests). */
  private[heapstate] def awaitBackground(): Unit = Seq(SnapshotThread, CleanupThread).foreach { thread =>
    val done = new java.util.concurrent.CountDownLatch(1)
    thread.execute(() => done.countDown())
    done.await()
  }

  /** Keeps a queued background snapshot from starting, or waits for one that has started. */
  private def cancelPendingSnapshot(): Unit = cancelOrAwait(pendingSnapshot)

  private def cancelOrAwait(pending: Background): Unit = if (pending != null) pending.cancelOrAwait()

  /**
   * One background task of this store (a snapshot or a cleanup). Whoever claims it first decides:
   * its thread runs it, or a canceller keeps it from ever starting (and, losing the claim, waits
   * for the end). A failure is logged with `what` and `consequence`.
   */
  private final class Background(body: () => Unit, what: String, consequence: String) extends Runnable {
    private val claimed = new java.util.concurrent.atomic.AtomicBoolean(false)
    private val finished = new java.util.concurrent.CountDownLatch(1)

    def isDone: Boolean = finished.getCount == 0

    override def run(): Unit = if (claimed.compareAndSet(false, true)) {
      try body()
      catch {
        case NonFatal(e) => log.warn(s"heapstate: $what of $storeId failed; $consequence", e)
      } finally finished.countDown()
    }

    def cancelOrAwait(): Unit = if (claimed.compareAndSet(false, true)) finished.countDown() else finished.await()
  }

  /**
   * Tells Spark's coordinator about a snapshot; without these reports Spark 4.2 and later count
   * the store as lagging after 50 versions and force a snapshot on every commit.
   */
  private def reportSnapshot(version: Long): Unit =
    try SnapshotReports.snapshotWritten(storeConf, storeId, hadoopConf, version)
    catch {
      case NonFatal(e) =>
        HeapStateStoreProvider.log.warn(s"heapstate: could not report the snapshot of version $version of $storeId " +
          s"to Spark's state store coordinator: $e")
    }

  override def doCleanupMaintenance(): Unit = if (engine != null && engine.isLoaded) engine.cleanup()

  override def supportedCustomMetrics: Seq[StateStoreCustomMetric] = CustomMetrics

  override def replayStateFromSnapshot(
      snapshotVersion: Long,
      endVersion: Long,
      readOnly: Boolean,
      startStateStoreCkptId: Option[String],
      endStateStoreCkptId: Option[String]): StateStore = {
    requireVersion(snapshotVersion); startStateStoreCkptId.foreach(requireId); endStateStoreCkptId.foreach(requireId)
    if (endVersion < snapshotVersion) {
      throw new IllegalArgumentException(s"heapstate: end version $endVersion is below snapshot " +
        s"version $snapshotVersion (state store $storeId)")
    }
    val live = engine.rebuildFromSnapshot(snapshotVersion, endVersion, startStateStoreCkptId, endStateStoreCkptId)
    new HeapStore(endVersion, endStateStoreCkptId, live, readOnly, forceSnapshot = false)
  }

  override def getStateStoreChangeDataReader(
      startVersion: Long,
      endVersion: Long,
      colFamilyNameOpt: Option[String],
      endStateStoreCkptId: Option[String]): ChangeFeedIterator[(RecordType.Value, UnsafeRow, UnsafeRow, Long)] = {
    colFamilyNameOpt.foreach(requireDefaultFamily); endStateStoreCkptId.foreach(requireId)
    if (startVersion < 1 || endVersion < startVersion) {
      throw new IllegalArgumentException(s"heapstate: invalid change feed range [$startVersion, " +
        s"$endVersion] for state store $storeId; versions start at 1")
    }
    new JournalChangeFeed(engine.journalChain(startVersion, endVersion, endStateStoreCkptId))
  }

  private def requireVersion(version: Long): Unit =
    if (version < 0)
      throw new IllegalArgumentException(s"heapstate: version $version of state store $storeId is negative")

  private def requireId(id: String): Unit = if (!heapstate.io.StateFileNames.isValidId(id)) {
    throw new IllegalArgumentException(s"heapstate: checkpoint id '$id' of state store $storeId is not " +
      "one heapstate can name files by (letters, digits and '-', at most 64)")
  }

  private def keyRow(bytes: Array[Byte]): UnsafeRow = {
    val r = new UnsafeRow(keyFields); r.pointTo(bytes, bytes.length); r
  }
  private def valueRow(bytes: Array[Byte]): UnsafeRow = {
    val r = new UnsafeRow(valueFields); r.pointTo(bytes, bytes.length); r
  }

  /**
   * Rows that point into an [[Entry]] at `b`/`at`: a change's array, or a live table page (entries
   * are never changed once written, so nothing is copied).
   */
  private def valueRowOf(b: Array[Byte], at: Int): UnsafeRow = pointToValue(new UnsafeRow(valueFields), b, at)
  /** `row`, pointed at the value of the entry at `b`/`at`. */
  private def pointToValue(row: UnsafeRow, b: Array[Byte], at: Int): UnsafeRow = {
    row.pointTo(b, Platform.BYTE_ARRAY_OFFSET + Entry.valueStart(b, at), Entry.valueLength(b, at)); row
  }
  private def pairOf(b: Array[Byte], at: Int): UnsafeRowPair = {
    val k = new UnsafeRow(keyFields)
    k.pointTo(b, Platform.BYTE_ARRAY_OFFSET + Entry.keyStart(at), Entry.keyLength(b, at))
    new UnsafeRowPair(k, valueRowOf(b, at))
  }
  private def pairOf(entry: Array[Byte]): UnsafeRowPair = pairOf(entry, 0)
  /** A look-up key for the key of the live entry at `address`. */
  private def liveKeyProbe(live: LiveState, address: Long): KeyProbe = {
    val page = live.pageOf(address)
    val at = live.offsetOf(address)
    new KeyProbe(page, Platform.BYTE_ARRAY_OFFSET + Entry.keyStart(at), Entry.keyLength(page, at))
  }
  /** The pair of the live entry at `address` (from `live`, with no change to it since). */
  private def livePairOf(live: LiveState, address: Long): UnsafeRowPair =
    pairOf(live.pageOf(address), live.offsetOf(address))

  /**
   * Reads the given journals (one lineage, oldest first) one by one; Spark's change feed calls a
   * version's changes batch `version - 1`.
   */
  private class JournalChangeFeed(journals: Seq[heapstate.io.StateFileNames.StateFile])
      extends ChangeFeedIterator[(RecordType.Value, UnsafeRow, UnsafeRow, Long)] {
    private val pending = journals.iterator
    private var records: Iterator[(RecordType.Value, UnsafeRow, UnsafeRow, Long)] = Iterator.empty

    override protected def nextRecord(): (RecordType.Value, UnsafeRow, UnsafeRow, Long) = {
      while (!records.hasNext && pending.hasNext) {
        val journal = pending.next()
        val batch = journal.version - 1
        val buffer = scala.collection.mutable.ArrayBuffer.empty[(RecordType.Value, UnsafeRow, UnsafeRow, Long)]
        engine.files.read(journal)(
          (k, v) => buffer += ((RecordType.PUT_RECORD, keyRow(k), valueRow(v), batch)),
          k => buffer += ((RecordType.DELETE_RECORD, keyRow(k), null, batch)))
        records = buffer.iterator
      }
      if (records.hasNext) records.next() else null
    }
  }

  /**
   * One version of the state, as a store. Reads look in the batch's [[ChangeSet]] first, then in
   * the live state, which does not move until this store commits.
   */
  private class HeapStore(
      override val version: Long,
      uniqueId: Option[String],
      live: LiveState,
      readOnly: Boolean,
      forceSnapshot: Boolean) extends StateStore {
    private val changes = new ChangeSet(live, changeSetPagesFrom)
    private var phase: Phase = Updating
    /**
     * A store a task writes counts in [[StateEngine.storesWriting]], for background snapshots to
     * wait for, until its commit returns, it is aborted or its task ends (whichever comes first: a
     * task that fails before either does not leave it counted). Read stores, and stores made
     * outside a task (tests, benchmarks), do not count.
     */
    private val writer: Option[StateEngine.Counted] =
      if (readOnly) None
      else Option(TaskContext.get()).map { task =>
        val w = StateEngine.writer()
        task.addTaskCompletionListener[Unit](_ => w.close())
        w
      }
    private var committed: CommitResult = _
    /**
     * Microseconds [[commit]] spent in the engine, and then reporting to Spark's coordinator; and
     * the CPU time its thread used in the engine (the wall time less any wait for a core or a disk).
     */
    private var storeMicros, reportMicros, storeCpuMicros = 0L
    /** Of [[storeMicros]], the time its thread was ready to run but waited for a core (Linux; else 0). */
    private var storeRunQueueMicros = 0L
    /** The live state's rebuilds from files when this store was made (after its `ensureAt`). */
    private val rebuilds = engine.rebuildsFromFiles
    /** Whether no row read from the live state needs checking (see [[checkRowFormat]]). */
    private var rowFormatChecked = rebuilds == rowsCheckedAfterRebuild

    override def id: StateStoreId = storeId

    /**
     * Spark's structural check of a stored key and value against the schemas the query gives
     * now, on the first row read from the live state after it was rebuilt from files, as HDFS
     * checks the first row it reads from its files. A query changed in a way its state rows no
     * longer fit (and that Spark's schema check did not catch, e.g. a checkpoint without schema
     * files) fails with Spark's error naming the store, instead of reading garbage. Rows this JVM
     * wrote are not checked, as on HDFS: Spark's own state format 1 of flatMapGroupsWithState with
     * a timeout fails the check on every row (its schema calls the long timeout an integer), and
     * such a query runs until it restarts, as on HDFS (RocksDB checks each store's first row and
     * fails it in its second batch). Off with
     * `spark.sql.streaming.stateStore.formatValidation.enabled=false`; the value is skipped where
     * Spark asks (`formatValidationCheckValue`).
     */
    private def checkRowFormat(key: UnsafeRow, value: UnsafeRow): Unit = {
      StateStoreProvider.validateStateRowFormat(key, keySchema, value, valueSchema, storeId, storeConf)
      rowFormatChecked = true
      rowsCheckedAfterRebuild = rebuilds
    }
    private def checkedLivePair(pair: UnsafeRowPair): UnsafeRowPair = {
      if (!rowFormatChecked) checkRowFormat(pair.key, pair.value)
      pair
    }

    /**
     * The rows [[get]] returns, pointed at each found value in turn: a row keeps its value through
     * the store's next [[HeapStateStoreProvider.GotRows]] - 1 gets, then points to another one.
     *  - RocksDB's provider reuses one row for every get (Spark's `SingleValueStateEncoder`: "the
     *    UnsafeRow returned is reused across calls"), so a caller correct there is correct here.
     *  - HDFS's rows never change, and Spark's stream-stream join of state format 1 relies on that
     *    across two gets: it reads a value, reads the last one into its place, then returns the
     *    first. These rows serve that too.
     */
    private val gotRows = Array.fill(HeapStateStoreProvider.GotRows)(new UnsafeRow(valueFields))
    private var gotNext = 0
    /** Whether this store may have changes to look in (set by every put and remove; see [[get]]). */
    private var mayHaveChanges = false

    /**
     * A key's value: from the batch's changes, else from the live state. Random gets of 1M keys
     * (stop 68, `bench/.../GetPath.scala`) wait on two cache misses each, the slot's and the
     * entry's, and run as fast as successive gets' misses overlap; so the path a get takes counts
     * its loads and allocates nothing:
     *  - a new row for each get (2,900 a ms with the value read, against 4,800 with a reused one
     *    in the same JVM): the get is compiled on its own, so its row escaped and was allocated,
     *    each in fresh memory;
     *  - looking up the entry, then its page again to point the row at it, and the change set's
     *    size through three objects: about 2,900 with the value read, where one step
     *    ([[LiveState.pointToValue]]) and one flag run at 4,900 to 5,000 (see
     *    docs/PERFORMANCE_HISTORY.md, stop 68).
     */
    override def get(key: UnsafeRow, colFamilyName: String): UnsafeRow = {
      requireDefaultFamily(colFamilyName)
      val hash = Key.hash(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes)
      val row = gotRows(gotNext)
      gotNext = (gotNext + 1) & (gotRows.length - 1)
      val changed =
        if (!mayHaveChanges || changes.isEmpty) null
        else changes.lookup(new KeyProbe(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes, hash))
      if (changed != null) {
        if (Tombstone.is(changed)) null else pointToValue(row, changed, 0)
      } else if (!live.pointToValue(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes, hash, row)) null
      else {
        if (!rowFormatChecked) checkRowFormat(key, row) // the key matched the stored one byte for byte
        row
      }
    }

    override def put(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit = {
      requireWritable("put"); requireDefaultFamily(colFamilyName)
      if (key == null || value == null) throw new IllegalArgumentException("heapstate: null key or value in put")
      mayHaveChanges = true
      val k = Key.copyOf(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes)
      changes.put(k, Entry.copyOf(k.bytes, value.getBaseObject, value.getBaseOffset, value.getSizeInBytes))
    }

    override def remove(key: UnsafeRow, colFamilyName: String): Unit = {
      requireWritable("remove"); requireDefaultFamily(colFamilyName)
      mayHaveChanges = true
      changes.remove(Key.copyOf(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes))
    }

    override def iterator(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
      requireDefaultFamily(colFamilyName)
      // Fixed at creation: keys this batch changed come from the copy, all others from the live
      // map, so writes made while iterating never hide or repeat a key.
      val changed = changes.copy()
      val fromChanges = changed.entrySet().iterator().asScala
        .filter(e => !Tombstone.is(e.getValue))
        .map(e => pairOf(e.getValue))
      val fromLive = live.iterator
        .filter(a => changed.isEmpty || !changed.containsKey(liveKeyProbe(live, a)))
        .map(a => checkedLivePair(livePairOf(live, a)))
      new StateStoreIterator(fromChanges ++ fromLive, () => ())
    }

    override def prefixScan(prefixKey: UnsafeRow, colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
      requireDefaultFamily(colFamilyName)
      val prefix = Key.copyOf(prefixKey.getBaseObject, prefixKey.getBaseOffset, prefixKey.getSizeInBytes)
      val changedKeys = changes.keysWithPrefix(prefix)
      val changedSet = new java.util.HashSet[Key](java.util.Arrays.asList(changedKeys: _*))
      val fromChanges = changedKeys.iterator.flatMap { k =>
        val v = changes.lookup(k)
        if (v == null || Tombstone.is(v)) None else Some(pairOf(v))
      }.toArray
      val fromLive = live.keysWithPrefix(prefix).iterator().asScala
        .filter(k => !changedSet.contains(k))
        .flatMap { k =>
          val a = live.get(k); if (a == EntryTable.NoEntry) None else Some(checkedLivePair(livePairOf(live, a)))
        }
      new StateStoreIterator(fromChanges.iterator ++ fromLive, () => ())
    }

    override def commit(): Long = {
      requireWritable("commit")
      val newId = if (checkpointIds) Some(java.util.UUID.randomUUID().toString) else None
      val started = System.nanoTime()
      val cpuStarted = ThreadClocks.cpuNanos()
      val queuedStarted = ThreadClocks.runQueueNanos()
      // The report to the coordinator counts as part of the commit, for the background snapshot
      // to yield to (see SnapshotPacer): it is a call to the driver, whose threads need a core to
      // answer it. In two of six W1 runs, reports made while a snapshot was written took 2 to 3.5
      // times as long as the others.
      val stored =
        try StateEngine.committing {
            committed = engine.commit(version, changes, uniqueId, newId)
            // The thread's clocks are read inside the wall time's interval, at both ends.
            val cpuEnded = ThreadClocks.cpuNanos()
            val queuedEnded = ThreadClocks.runQueueNanos()
            val stored = System.nanoTime()
            storeCpuMicros = (cpuEnded - cpuStarted) / 1000
            storeRunQueueMicros =
              if (queuedStarted >= 0 && queuedEnded >= queuedStarted) (queuedEnded - queuedStarted) / 1000 else 0L
            phase = Committed
            changes.release() // the live state and the undo log hold what they need of it
            if (storeConf.commitValidationEnabled) reportCommit(committed.version, storeId, hadoopConf)
            stored
          }
        finally writer.foreach(_.close())
      storeMicros = (stored - started) / 1000
      reportMicros = (System.nanoTime() - stored) / 1000
      if (forceSnapshot || committed.bulkLoad) engine.snapshotIfDue(force = true).foreach(reportSnapshot)
      // A batch that began by rebuilding its state from files (a restart, a moved store) leaves
      // the cores to the other partitions still loading; the next commit starts the snapshot.
      else if (!engine.rebuiltAt(version)) snapshotSoon()
      cleanupSoon()
      committed.version
    }

    override def abort(): Unit = {
      if (phase == Updating) { phase = Aborted; changes.clear() }
      writer.foreach(_.close())
    }

    override def release(): Unit = abort()

    override def hasCommitted: Boolean = phase == Committed

    override def metrics: StateStoreMetrics = {
      val current = if (engine.isLoaded) engine.live else live
      val pending = phase == Updating
      StateStoreMetrics(
        numKeys = current.numKeys + (if (pending) changes.keyDelta else 0),
        memoryUsedBytes = current.memoryBytes + engine.reuseAccountBytes + (if (pending) changes.bytes else 0),
        customMetrics = Map(
          JournalBytes -> (if (committed == null) 0L else committed.journalBytes),
          KeysWritten -> (if (committed == null) 0L else committed.keysWritten),
          UpdatesSquashed -> (if (committed == null) 0L else committed.squashed),
          SnapshotLag -> engine.snapshotLag,
          LoadTime -> engine.loadMsOf(version),
          CommitStoreTime -> storeMicros,
          CommitReportTime -> reportMicros,
          CommitStoreCpuTime -> storeCpuMicros,
          CommitStoreRunQueueTime -> storeRunQueueMicros,
          BucketsPending -> engine.bucketsPending,
          BucketsCopied -> engine.snapshotBucketsReused,
          SnapshotBytesBesideTasks -> engine.snapshotBytesBesideTasks
        )
      )
    }

    /** In format v2, the committed version's checkpoint id and the id of the version below it. */
    override def getStateStoreCheckpointInfo(): StateStoreCheckpointInfo =
      if (committed == null) StateStoreCheckpointInfo(storeId.partitionId, version + 1, None, uniqueId)
      else StateStoreCheckpointInfo(storeId.partitionId, committed.version, committed.id, committed.baseId)

    override def allColumnFamilyNames: Set[String] = Set(StateStore.DEFAULT_COL_FAMILY_NAME)

    override def createColFamilyIfAbsent(
        colFamilyName: String,
        keySchema: StructType,
        valueSchema: StructType,
        keyStateEncoderSpec: KeyStateEncoderSpec,
        useMultipleValuesPerKey: Boolean,
        isInternal: Boolean): Unit = requireDefaultFamily(colFamilyName)

    override def removeColFamilyIfExists(colFamilyName: String): Boolean = false

    override def valuesIterator(key: UnsafeRow, colFamilyName: String): Iterator[UnsafeRow] = multiValues()
    override def prefixScanWithMultiValues(
        prefixKey: UnsafeRow, colFamilyName: String): StateStoreIterator[UnsafeRowPair] = multiValues()
    override def iteratorWithMultiValues(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = multiValues()
    override def merge(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit = multiValues()
    override def putList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit = multiValues()
    override def mergeList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit = multiValues()

    override def toString: String = s"HeapStateStore[id=$storeId, version=$version, phase=$phase]"

    private def requireWritable(op: String): Unit = {
      if (readOnly)
        throw new UnsupportedOperationException(s"heapstate: $op on read-only store $storeId version $version")
      if (phase != Updating) {
        throw new IllegalStateException(
          s"heapstate: $op on store $storeId version $version after it was ${phase.toString.toLowerCase}")
      }
    }

    private def multiValues(): Nothing = throw new UnsupportedOperationException(
      s"heapstate does not support multiple values per key (state store $storeId); " +
        "transformWithState runs on RocksDBStateStoreProvider only")
  }

  private def requireDefaultFamily(name: String): Unit = if (name != StateStore.DEFAULT_COL_FAMILY_NAME) {
    throw new UnsupportedOperationException(s"heapstate serves only the default column family, not " +
      s"'$name' (state store $storeId); column families are transformWithState's, which Spark runs on RocksDB only")
  }
}

object HeapStateStoreProvider {
  private val log = LoggerFactory.getLogger(classOf[HeapStateStoreProvider])

  /** How many rows a store's gets take turns to return (a power of two; see `HeapStore.gotRows`). */
  private[heapstate] val GotRows = 16
  require(Integer.bitCount(GotRows) == 1, s"GotRows must be a power of two, not $GotRows")

  /** Set once a store of this JVM logged [[TaskActivityPlugin.missingWarning]] (tests reset it). */
  private[heapstate] val NoTaskPluginWarned = new java.util.concurrent.atomic.AtomicBoolean()

  /** The one daemon thread that writes snapshots commits have made due, for every store in the JVM. */
  private lazy val SnapshotThread: java.util.concurrent.Executor = daemonThread("heapstate-snapshot")
  /** The one daemon thread that cleans up after the snapshots of every store in the JVM. */
  private lazy val CleanupThread: java.util.concurrent.Executor = daemonThread("heapstate-cleanup")

  private def daemonThread(name: String): java.util.concurrent.Executor =
    java.util.concurrent.Executors.newSingleThreadExecutor { (r: Runnable) =>
      val t = new Thread(r, name)
      t.setDaemon(true)
      t
    }
  private sealed trait Phase
  private case object Updating extends Phase
  private case object Committed extends Phase
  private case object Aborted extends Phase

  val JournalBytes: StateStoreCustomMetric =
    StateStoreCustomSumMetric("heapstateJournalBytes", "heapstate: journal bytes written")
  val KeysWritten: StateStoreCustomMetric =
    StateStoreCustomSumMetric("heapstateKeysWritten", "heapstate: keys written to journals (after squashing)")
  val UpdatesSquashed: StateStoreCustomMetric =
    StateStoreCustomSumMetric("heapstateUpdatesSquashed", "heapstate: puts and removes squashed away")
  val SnapshotLag: StateStoreCustomMetric =
    StateStoreCustomSumMetric("heapstateSnapshotLagVersions",
      "heapstate: versions since the last snapshot, summed over partitions")

  val LoadTime: StateStoreCustomMetric =
    StateStoreCustomTimingMetric(
      "heapstateLoadMs",
      "heapstate: ms spent rebuilding this batch's starting version from files (after a restart or a move; a bucketed snapshot's buckets load later, as keys are asked for), summed over partitions"
    )

  val BucketsPending: StateStoreCustomMetric =
    StateStoreCustomSumMetric(
      "heapstateSnapshotBucketsPending",
      "heapstate: buckets of a snapshot still to load after a rebuild from files (loaded as keys are asked for, and a share after each commit), summed over partitions"
    )

  val BucketsCopied: StateStoreCustomMetric =
    StateStoreCustomSumMetric(
      "heapstateSnapshotBucketsCopied",
      "heapstate: snapshot buckets copied from the store's previous snapshot instead of compressed again, since the store was opened, summed over partitions"
    )

  val SnapshotBytesBesideTasks: StateStoreCustomMetric =
    StateStoreCustomSumMetric(
      "heapstateSnapshotBytesBesideTasks",
      "heapstate: bytes of background snapshots (entries collected and buckets compressed, before compression; buckets copied, as stored) written while tasks were busy, their budget for waiting for them spent, since the store was opened, summed over partitions"
    )

  /**
   * Where a commit's time goes. Spark's `commitTimeMs` is the whole of `commit`: the store's own
   * work (journal, table, undo log), then the report to Spark's state store coordinator, a call to
   * the driver that every provider makes and waits for, and a background snapshot's start (or a
   * snapshot Spark forces, written there and then: in neither part).
   */
  val CommitStoreTime: StateStoreCustomMetric =
    StateStoreCustomSumMetric("heapstateCommitStoreMicros",
      "heapstate: microseconds its commits spent in the store (journal, table, undo log), summed over partitions")
  val CommitReportTime: StateStoreCustomMetric =
    StateStoreCustomSumMetric("heapstateCommitReportMicros",
      "heapstate: microseconds its commits waited for Spark's report to the state store coordinator, summed over partitions")

  /**
   * The CPU time of the store's part of the commit ([[CommitStoreTime]]), from the JVM's per-thread
   * CPU clock: the work itself, without the time the task thread waited for a core (shared with
   * the JIT compiler, GC, other tasks, snapshots) or for the disk. Zero where the JVM has no such
   * clock.
   */
  val CommitStoreCpuTime: StateStoreCustomMetric =
    StateStoreCustomSumMetric(
      "heapstateCommitStoreCpuMicros",
      "heapstate: CPU microseconds its commits used in the store (its part of heapstateCommitStoreMicros spent running), summed over partitions"
    )

  /**
   * Of the store's part of the commit ([[CommitStoreTime]]), the time its thread was ready to run
   * but waited for a core, which Linux counts per thread (the second figure of
   * `/proc/thread-self/schedstat`). With [[CommitStoreCpuTime]] it splits the store's part in
   * three: running, waiting for a core, and blocked (on the disk or a lock). Zero where the
   * system does not count it.
   */
  val CommitStoreRunQueueTime: StateStoreCustomMetric =
    StateStoreCustomSumMetric(
      "heapstateCommitStoreRunQueueMicros",
      "heapstate: microseconds its commits were ready to run in the store but waited for a core (Linux only; else 0), summed over partitions"
    )

  val CustomMetrics: Seq[StateStoreCustomMetric] = Seq(
    JournalBytes,
    KeysWritten,
    UpdatesSquashed,
    SnapshotLag,
    LoadTime,
    BucketsPending,
    BucketsCopied,
    SnapshotBytesBesideTasks,
    CommitStoreTime,
    CommitReportTime,
    CommitStoreCpuTime,
    CommitStoreRunQueueTime
  )

  /** Extracts the prefix key's bytes from a key's bytes (a projection per thread: they keep buffers). */
  private def prefixExtractor(keySchema: StructType, numColsPrefixKey: Int): Array[Byte] => Key = {
    val fields = keySchema.fields
    val projection = ThreadLocal.withInitial[(UnsafeRow, UnsafeProjection)] { () =>
      val refs = fields.take(numColsPrefixKey).zipWithIndex.map { case (f, i) =>
        BoundReference(i, f.dataType, f.nullable)
      }
      (new UnsafeRow(fields.length), UnsafeProjection.create(refs.toSeq))
    }
    bytes => {
      val (row, proj) = projection.get()
      row.pointTo(bytes, bytes.length)
      val p = proj(row)
      Key.copyOf(p.getBaseObject, p.getBaseOffset, p.getSizeInBytes)
    }
  }
}
