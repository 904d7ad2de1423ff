package heapstate

import java.util.{Map => JMap}

import org.apache.spark.{SparkConf, TaskContext}
import org.apache.spark.api.plugin.{DriverPlugin, ExecutorPlugin, PluginContext, SparkPlugin}

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
 * succeeds, fails or is killed. Without the plugin nothing changes: the count stays 0, and the
 * first store a JVM opens logs a warning that says so ([[TaskActivityPlugin.missingWarning]]).
 *
 * As its executor starts, it tells the engine how many cores the executor has
 * ([[TaskActivityPlugin.executorCores]]); see `StateEngine.cores`.
 */
class TaskActivityPlugin extends SparkPlugin {
  override def driverPlugin(): DriverPlugin = null

  override def executorPlugin(): ExecutorPlugin = new ExecutorPlugin {
    override def init(ctx: PluginContext, extraConf: JMap[String, String]): Unit =
      StateEngine.taskPluginStarted(TaskActivityPlugin.executorCores(ctx.conf(),
          Runtime.getRuntime.availableProcessors))

    override def shutdown(): Unit = StateEngine.taskPluginStopped()

    // `cpus` is deprecated in Spark 4.3 for `cpuAmount`, which Spark 4.2 does not have.
    @annotation.nowarn("cat=deprecation")
    override def onTaskStart(): Unit = Option(TaskContext.get()).foreach { task =>
      val counted = StateEngine.taskStarted(task.cpus())
      task.addTaskCompletionListener[Unit](_ => counted.close())
    }
  }
}

object TaskActivityPlugin {
  /**
   * The cores that an executor started with `conf` runs tasks on, out of its JVM's `processors`.
   * A local master (`local`, `local[N]`, `local[*]`, with or without failures) runs in a JVM that
   * has the machine to itself: `processors`. Elsewhere, `spark.executor.cores` when it is set and
   * fewer, since the executor then shares its node's processors with others; else `processors`
   * (a standalone executor without it takes every core of its worker).
   */
  def executorCores(conf: SparkConf, processors: Int): Int = {
    val master = conf.get("spark.master", "")
    if (master == "local" || master.startsWith("local[")) processors
    else conf.getOption("spark.executor.cores").flatMap(_.trim.toIntOption).filter(_ > 0)
      .fold(processors)(math.min(_, processors))
  }

  /** What a JVM's first store logs when this plugin does not count the JVM's tasks; `None` when it does. */
  def missingWarning: Option[String] =
    if (StateEngine.taskPluginActive) None
    else Some(s"heapstate: ${classOf[TaskActivityPlugin].getName} is not in this JVM's spark.plugins, so " +
      "background snapshots wait only for tasks that write a state store, and may run beside stateless " +
      "stages that need every core. heapstate.configure(builder) and `heapstate submit-args` register it; " +
      "a later spark.plugins setting replaces their list, and a live session cannot add it.")
}
