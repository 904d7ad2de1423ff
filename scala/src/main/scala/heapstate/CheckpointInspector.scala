package heapstate

import java.util.{ArrayList => JList, LinkedHashMap => JMap}

import scala.util.control.NonFatal

import com.fasterxml.jackson.databind.ObjectMapper
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}

import heapstate.io.{StateFileException, StateFileNames, StateFiles}
import heapstate.io.StateFileNames.{Journal, Snapshot, StateFile}

/**
 * Describes the heapstate stores of a checkpoint, for `heapstate inspect` (which calls it through
 * py4j, so that the file format is parsed in one place only). For every store directory under
 * `<checkpoint>/state` holding heapstate files, it lists the files (verifying each one fully
 * when asked: header, records, checksums), and for every version the snapshot it recovers from
 * and the length of its journal chain, or why it cannot be recovered.
 */
object CheckpointInspector {
  private val json = new ObjectMapper()

  def describeJson(checkpoint: String, verify: Boolean): String =
    json.writerWithDefaultPrettyPrinter().writeValueAsString(describe(checkpoint, verify, new Configuration()))

  def describe(checkpoint: String, verify: Boolean, hadoopConf: Configuration): JMap[String, AnyRef] = {
    val root = new Path(checkpoint)
    val fs = root.getFileSystem(hadoopConf)
    val stateDir = fs.makeQualified(new Path(root, "state"))
    val stores = new JList[AnyRef]()
    if (fs.exists(stateDir))
      storeDirs(fs, stateDir).foreach(dir => stores.add(describeStore(dir, stateDir, verify, hadoopConf)))
    val out = new JMap[String, AnyRef]()
    out.put("checkpoint", root.toString)
    out.put("stores", stores)
    out
  }

  /** Directories under `state/` that hold heapstate files, in operator/partition/store order. */
  private def storeDirs(fs: FileSystem, dir: Path): Seq[Path] = {
    val entries = fs.listStatus(dir).toSeq
    val here = if (entries.exists(e => e.isFile && StateFileNames.parse(e.getPath.getName).isDefined)) Seq(dir) else Nil
    val below =
      entries.filter(e => e.isDirectory && !e.getPath.getName.startsWith("_") && !e.getPath.getName.startsWith("."))
        .sortBy(e => e.getPath.getName.toLongOption.map(n => f"$n%020d").getOrElse(e.getPath.getName))
        .flatMap(e => storeDirs(fs, e.getPath))
    here ++ below
  }

  private def describeStore(
      dir: Path, stateDir: Path, verify: Boolean, hadoopConf: Configuration): JMap[String, AnyRef] = {
    val parts = stateDir.toUri.relativize(dir.toUri).getPath.stripSuffix("/").split("/")
    val files = new StateFiles(dir, hadoopConf, parts.lift(1).flatMap(_.toIntOption).getOrElse(-1))
    val listed = files.list()
    val broken = scala.collection.mutable.Map.empty[(Long, StateFileNames.Kind), String]
    val fileList = new JList[AnyRef]()
    for (f <- listed) {
      val entry = new JMap[String, AnyRef]()
      entry.put("name", f.path.getName)
      entry.put("kind", if (f.kind == Journal) "journal" else "snapshot")
      entry.put("version", Long.box(f.version))
      entry.put("bytes", Long.box(f.length))
      if (verify) {
        var records = 0L
        try {
          val header = files.read(f)((_, _) => records += 1, _ => records += 1).header
          entry.put("records", Long.box(records))
          entry.put("codec", header.codec.name)
          entry.put("status", "ok")
        } catch {
          case e: StateFileException =>
            broken((f.version, f.kind)) = e.getMessage
            entry.put("status", "corrupt")
            entry.put("problem", e.getMessage)
          case NonFatal(e) =>
            broken((f.version, f.kind)) = e.toString
            entry.put("status", "unreadable")
            entry.put("problem", e.toString)
        }
      } else entry.put("status", "not verified")
      fileList.add(entry)
    }
    val out = new JMap[String, AnyRef]()
    out.put("path", dir.toString)
    out.put("operator", parts.headOption.flatMap(_.toLongOption).map(Long.box).orNull)
    out.put("partition", parts.lift(1).flatMap(_.toIntOption).map(Int.box).orNull)
    out.put("store", parts.lift(2).getOrElse("default"))
    out.put("files", fileList)
    out.put("versions", versions(listed, broken.toMap, dir))
    out
  }

  /**
   * For every version from the oldest recoverable one up: what it recovers from, or why not. In
   * checkpoint format v2 a version may have several attempts' files; this view goes by version
   * number and names the first file of each version.
   */
  private def versions(
      listed: Seq[StateFile], broken: Map[(Long, StateFileNames.Kind), String], dir: Path): JList[AnyRef] = {
    val out = new JList[AnyRef]()
    if (listed.isEmpty) return out
    val journals = listed.filter(_.kind == Journal).map(_.version).toSet
    val snapshots =
      listed.filter(f => f.kind == Snapshot && !broken.contains((f.version, Snapshot))).map(_.version).sorted
    val latest = listed.map(_.version).max
    def nameOf(v: Long, kind: StateFileNames.Kind): String =
      listed.find(f => f.version == v && f.kind == kind).map(_.path.getName)
        .getOrElse((if (kind == Journal) StateFileNames.journal(dir, v) else StateFileNames.snapshot(dir, v)).getName)
    val oldest = (snapshots.headOption.toSeq ++ Seq(if (journals.contains(1)) 0L else Long.MaxValue)).min.max(0L)
    for (v <- math.max(oldest, 1L) to latest) {
      val entry = new JMap[String, AnyRef]()
      entry.put("version", Long.box(v))
      // Newest intact snapshot at or below v whose journals above it are all present and intact.
      val base = (snapshots.filter(_ <= v).reverse :+ 0L).find { s =>
        (s + 1 to v).forall(j => journals.contains(j) && !broken.contains((j, Journal)))
      }
      base match {
        case Some(s) =>
          entry.put("recoversFrom", if (s == 0) "empty" else nameOf(s, Snapshot))
          entry.put("journalChain", Long.box(v - s))
          entry.put("recoverable", java.lang.Boolean.TRUE)
        case None =>
          val newest = (snapshots.filter(_ <= v).reverse :+ 0L).head
          val missing = (newest + 1 to v).find(j => !journals.contains(j) || broken.contains((j, Journal)))
          entry.put("recoverable", java.lang.Boolean.FALSE)
          entry.put(
            "problem",
            missing.map { j =>
              val name = nameOf(j, Journal)
              if (journals.contains(j)) s"journal $name (version $j) is damaged"
              else s"journal $name (version $j) is missing"
            }.getOrElse("no usable snapshot or journal chain")
          )
      }
      out.add(entry)
    }
    out
  }
}
