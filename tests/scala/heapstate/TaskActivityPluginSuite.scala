package heapstate

import java.util.concurrent.{ConcurrentLinkedQueue, CountDownLatch, TimeUnit}

import scala.jdk.CollectionConverters._

import org.apache.spark.SparkConf
import org.apache.spark.sql.SparkSession
import org.scalatest.BeforeAndAfterAll
import org.scalatest.funsuite.AnyFunSuite

import heapstate.engine.StateEngine

object TaskActivityPluginSuite {
  /** What each task saw of [[StateEngine.taskCoresInUse]] once both tasks had started, a core each. */
  val Seen = new ConcurrentLinkedQueue[Integer]()
  /** What each task saw of [[StateEngine.busyWith]] for 2 and 3 cores, at the same time. */
  val Busy = new ConcurrentLinkedQueue[(Boolean, Boolean)]()
  /** Counted down by each task as it starts; the tasks look at the count once all have. */
  @volatile var Started: CountDownLatch = _
  /** Counted down by each task once it has looked; no task ends before all have. */
  @volatile var Looked: CountDownLatch = _
}

/**
 * [[TaskActivityPlugin]] on a real local Spark: every running task counts its core in
 * [[StateEngine.taskCoresInUse]], whether or not it writes a store, so that background snapshots
 * wait once the tasks hold every core ([[StateEngine.busyWith]]); no task stays counted after it
 * ends, whether it succeeded or failed. The plugin tells the engine its executor's cores while
 * the session runs, and stops counting once it stops.
 */
class TaskActivityPluginSuite extends AnyFunSuite with BeforeAndAfterAll {
  import TaskActivityPluginSuite._

  private var spark: SparkSession = _

  override def beforeAll(): Unit = {
    spark = SparkSession.builder()
      .master("local[2]")
      .appName(getClass.getSimpleName)
      .config("spark.ui.enabled", "false")
      .config("spark.plugins", classOf[TaskActivityPlugin].getName)
      .getOrCreate()
  }

  override def afterAll(): Unit = if (spark != null) spark.stop()

  private val processors = Runtime.getRuntime.availableProcessors

  /** Runs a job of `tasks` tasks on two cores: the first two look at the counts while both run. */
  private def runTwoAtOnce(tasks: Int, failOn: Int = -1): Unit = {
    Started = new CountDownLatch(2)
    Looked = new CountDownLatch(2)
    spark.sparkContext.parallelize(0 until tasks, tasks).foreach { i =>
      // Not scalatest's assert: the closure would capture the suite, which does not serialize.
      def await(latch: CountDownLatch, what: String): Unit =
        if (!latch.await(60, TimeUnit.SECONDS)) throw new IllegalStateException(s"task $i: the other task never $what")
      Started.countDown()
      await(Started, "started")
      Seen.add(StateEngine.taskCoresInUse)
      Busy.add((StateEngine.busyWith(2), StateEngine.busyWith(3)))
      Looked.countDown()
      await(Looked, "looked")
      if (i == failOn) throw new IllegalStateException(s"the test fails task $i")
    }
  }

  private def awaitNoneCounted(): Unit = {
    // A task's completion listener runs before Spark hears that it ended; allow a moment anyway.
    val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10)
    while (StateEngine.taskCoresInUse != 0 && System.nanoTime() < deadline) Thread.sleep(10)
    assert(StateEngine.taskCoresInUse == 0, "tasks still counted after their job ended")
    assert(!StateEngine.tasksBusy, "busy with no task running, no store written and no commit")
  }

  test("two tasks running at once, neither writing a store, hold two cores; none once the job ends") {
    Seen.clear(); Busy.clear()
    assert(!StateEngine.busyWith(1), "busy with no task running, no store written and no commit")
    runTwoAtOnce(tasks = 2)
    assert(Seen.asScala.toList.map(_.intValue) == List(2, 2))
    // Busy once the tasks hold every core: two tasks fill two cores, not three.
    assert(Busy.asScala.toList == List((true, false), (true, false)))
    awaitNoneCounted()
  }

  test("a failed task is not left counted") {
    Seen.clear(); Busy.clear()
    val failed = intercept[Exception](runTwoAtOnce(tasks = 2, failOn = 1))
    assert(Iterator.iterate(failed: Throwable)(_.getCause).takeWhile(_ != null)
        .exists(e => String.valueOf(e.getMessage).contains("the test fails task 1")), failed)
    awaitNoneCounted()
  }

  test("an executor's cores: a local JVM's processors; elsewhere spark.executor.cores when fewer") {
    def cores(processors: Int, settings: (String, String)*): Int =
      TaskActivityPlugin.executorCores(new SparkConf(false).setAll(settings), processors)
    for (master <- Seq("local", "local[2]", "local[*]", "local[1,3]", "local[*,2]"))
      assert(cores(8, "spark.master" -> master, "spark.executor.cores" -> "1") == 8, master)
    assert(cores(32, "spark.master" -> "spark://host:7077", "spark.executor.cores" -> "4") == 4)
    assert(cores(32, "spark.master" -> "yarn", "spark.executor.cores" -> " 6 ") == 6)
    assert(cores(2, "spark.master" -> "yarn", "spark.executor.cores" -> "8") == 2) // capped by the JVM's
    assert(cores(16, "spark.master" -> "local-cluster[2,3,1024]", "spark.executor.cores" -> "3") == 3)
    assert(cores(16, "spark.master" -> "spark://host:7077") == 16) // unset: the worker's every core
    assert(cores(16, "spark.master" -> "k8s://https://api", "spark.executor.cores" -> "0") == 16)
    assert(cores(16, "spark.master" -> "yarn", "spark.executor.cores" -> "four") == 16)
  }

  /** The warnings that opening `stores` providers, one after another, logs, from a JVM that has not warned yet. */
  private def warningsOpening(stores: Int): Seq[String] = {
    HeapStateStoreProvider.NoTaskPluginWarned.set(false) // another suite's stores may have warned
    val root = StoreFixture.tempDir()
    val (_, lines) = StoreFixture.logged(classOf[HeapStateStoreProvider]) {
      (0 until stores).foreach(p => StoreFixture.provider(root, partition = p).close())
    }
    lines.collect { case ("WARN", message) => message }
  }

  test("while the session runs, the plugin counts this JVM's tasks, on its processors, and no warning is due") {
    assert(StateEngine.taskPluginActive)
    assert(StateEngine.cores == processors) // local[2]: the JVM's processors, whatever the machine
    assert(TaskActivityPlugin.missingWarning.isEmpty)
    assert(warningsOpening(2).isEmpty)
  }

  test("once the session stops, the plugin no longer counts, and a store would warn that it is missing") {
    spark.stop()
    spark = null
    assert(!StateEngine.taskPluginActive)
    assert(StateEngine.cores == processors)
    val warning = TaskActivityPlugin.missingWarning.getOrElse(fail("no warning without the plugin"))
    assert(warning.contains("heapstate.TaskActivityPlugin") && warning.contains("spark.plugins"), warning)
    // The first store opened logs it, once for the JVM.
    assert(warningsOpening(3) == Seq(warning))
  }
}
