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
 * Why: W1's first stage (a Parquet scan and a partial aggregation) writes no store, so a snapshot
 * ran beside it, and the snapshot thread was the largest single thread that task threads waited
 * behind for a core (stop 38, `perf` sched_switch).
 *
 * A task counts from the plugin's `onTaskStart` until its completion listeners run, which Spark
 * calls once per started task whether it succeeds, fails or is killed. Without the plugin nothing
 * changes: the count stays 0.
 */
class TaskActivityPlugin extends SparkPlugin {
  override def driverPlugin(): DriverPlugin = null

  override def executorPlugin(): ExecutorPlugin = new ExecutorPlugin {
    override def onTaskStart(): Unit = Option(TaskContext.get()).foreach { task =>
      val counted = StateEngine.taskRunning()
      task.addTaskCompletionListener[Unit](_ => counted.close())
    }
  }
}
