package heapstate

import java.util.concurrent.{ConcurrentLinkedQueue, CountDownLatch, TimeUnit}

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.SparkSession
import org.scalatest.BeforeAndAfterAll
import org.scalatest.funsuite.AnyFunSuite

import heapstate.engine.StateEngine

object TaskActivityPluginSuite {
  /** What each task saw of [[StateEngine.tasksRunning]] once every task of its job had started. */
  val Seen = new ConcurrentLinkedQueue[Integer]()
  /** What each task saw of [[StateEngine.tasksBusy]] at the same time. */
  val Busy = new ConcurrentLinkedQueue[java.lang.Boolean]()
  /** Counted down by each task as it starts; the tasks look at the count once all have. */
  @volatile var Started: CountDownLatch = _
  /** Counted down by each task once it has looked; no task ends before all have. */
  @volatile var Looked: CountDownLatch = _
}

/**
 * [[TaskActivityPlugin]] on a real local Spark: every running task counts in
 * [[StateEngine.tasksRunning]] (and so makes [[StateEngine.tasksBusy]] true, for background
 * snapshots to wait for), whether or not it writes a store, and no task stays counted after it
 * ends, whether it succeeded or failed.
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
      Seen.add(StateEngine.tasksRunning)
      Busy.add(StateEngine.tasksBusy)
      Looked.countDown()
      await(Looked, "looked")
      if (i == failOn) throw new IllegalStateException(s"the test fails task $i")
    }
  }

  private def awaitNoneCounted(): Unit = {
    // A task's completion listener runs before Spark hears that it ended; allow a moment anyway.
    val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10)
    while (StateEngine.tasksRunning != 0 && System.nanoTime() < deadline) Thread.sleep(10)
    assert(StateEngine.tasksRunning == 0, "tasks still counted after their job ended")
    assert(!StateEngine.tasksBusy, "busy with no task running, no store written and no commit")
  }

  test("two tasks running at once, neither writing a store, count as two; none once the job ends") {
    Seen.clear(); Busy.clear()
    runTwoAtOnce(tasks = 2)
    assert(Seen.asScala.toList.map(_.intValue) == List(2, 2))
    // Busy once tasks run on every core: on a machine of two cores, these two tasks are enough.
    val everyCore = StateEngine.cores <= 2
    assert(Busy.asScala.toList.map(_.booleanValue) == List(everyCore, everyCore), s"${StateEngine.cores} cores")
    awaitNoneCounted()
  }

  test("a failed task is not left counted") {
    Seen.clear(); Busy.clear()
    val failed = intercept[Exception](runTwoAtOnce(tasks = 2, failOn = 1))
    assert(Iterator.iterate(failed: Throwable)(_.getCause).takeWhile(_ != null)
      .exists(e => String.valueOf(e.getMessage).contains("the test fails task 1")), failed)
    awaitNoneCounted()
  }
}
