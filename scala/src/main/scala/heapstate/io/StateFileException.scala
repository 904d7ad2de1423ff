package heapstate.io

import org.apache.hadoop.fs.Path

/**
 * A heapstate file that cannot be used: missing, truncated, or failing its checks. The message
 * always names the path and the state version, so an operator can find the file at fault.
 */
class StateFileException(val path: Path, val version: Long, reason: String, cause: Throwable = null)
    extends java.io.IOException(
      s"heapstate: state file $path (version $version) cannot be used: $reason",
      cause)

class MissingStateFileException(path: Path, version: Long, reason: String)
    extends StateFileException(path, version, reason)
