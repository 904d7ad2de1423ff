package heapstate;

import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreCoordinatorRef;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider$;
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId;

import scala.Option;

/**
 * Tells Spark's StateStoreCoordinator that a state store wrote a snapshot, as Spark's own
 * providers do. Since Spark 4.1 the coordinator counts a store that has reported no snapshot for
 * {@code minDeltasForSnapshot} times {@code multiplierForMinVersionDiffToLog} versions (50 by
 * default) as lagging, and with {@code forceSnapshotUploadOnLag} asks for a snapshot on every
 * commit of it from then on. Written in Java because the coordinator reference is
 * {@code private[state]} to Scala code outside Spark's package; Java does not see that limit.
 */
final class SnapshotReports {
  private SnapshotReports() {}

  /**
   * Reports the snapshot of {@code version} when the conf asks for reports and the store runs
   * inside a streaming query (its Hadoop conf carries the run id). Returns whether it reported.
   */
  static boolean snapshotWritten(StateStoreConf conf, StateStoreId id, Configuration hadoopConf, long version) {
    String runId = hadoopConf.get("sql.streaming.runId");
    if (!conf.reportSnapshotUploadLag() || runId == null) {
      return false;
    }
    Option<StateStoreCoordinatorRef> ref = StateStoreProvider$.MODULE$.coordinatorRef();
    if (ref.isEmpty()) {
      return false;
    }
    ref.get().snapshotUploaded(new StateStoreProviderId(id, UUID.fromString(runId)), version, System.currentTimeMillis());
    return true;
  }
}
