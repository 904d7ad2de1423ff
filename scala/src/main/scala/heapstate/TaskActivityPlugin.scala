package heapstate

import org.apache.spark.TaskContext
import org.apache.spark.api.plugin.{DriverPlugin, ExecutorPlugin, SparkPlugin}

import heapstate.engine.StateEngine

/**
 * Counts every task an executor runs, so that heapstate's background snapshots also wait while
 * tasks of any kind run on every core, not only while a task writes a store (see
 * `engine.SnapshotPacer` and `StateEngine.tasksBusy`). Register it with
 * `spark.plugins=heapstate.TaskActivityPlugin`; `heapstate.configure(builder)` and
 * `heapstate submit-args` do.
 *
 * Why: a stage that writes no store (W1's Parquet scan and partial aggregation) still needs the
 * cores, and without this plugin a snapshot ran beside it (README, stops 38 and 39).
 *
 * A task counts, with the cores it holds (`spark.task.cpus`), from the plugin's `onTaskStart`
 * until its completion listeners run, which Spark calls once per started task whether it
 * succeeds, fails or is killed. Without the plugin nothing changes: the count stays 0.
 */
class TaskActivityPlugin extends SparkPlugin {
  override def driverPlugin(): DriverPlugin = null

  override def executorPlugin(): ExecutorPlugin = new ExecutorPlugin {
    // `cpus` is deprecated in Spark 4.3 for `cpuAmount`, which Spark 4.2 does not have.
    @annotation.nowarn("cat=deprecation")
    override def onTaskStart(): Unit = Option(TaskContext.get()).foreach { task =>
      val counted = StateEngine.taskStarted(task.cpus())
      task.addTaskCompletionListener[Unit](_ => counted.close())
    }
  }
}
