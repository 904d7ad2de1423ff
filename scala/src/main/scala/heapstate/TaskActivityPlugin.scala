package heapstate

import java.util.{Map => JMap}

import org.apache.spark.TaskContext
import org.apache.spark.api.plugin.{DriverPlugin, ExecutorPlugin, PluginContext, SparkPlugin}

import heapstate.engine.StateEngine

/**
 * Counts every task an executor runs, so that heapstate's background snapshots wait for all of
 * them, not only for the tasks that write a store (see `engine.SnapshotPacer`). Register it with
 * `spark.plugins=heapstate.TaskActivityPlugin`; `heapstate.configure(builder)` does.
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
    override def init(ctx: PluginContext, extraConf: JMap[String, String]): Unit = ()

    override def onTaskStart(): Unit = Option(TaskContext.get()).foreach { task =>
      val counted = StateEngine.taskRunning()
      task.addTaskCompletionListener[Unit](_ => counted.close())
    }
  }
}
