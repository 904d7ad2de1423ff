package heapstate

import java.io.{File, RandomAccessFile}

import scala.jdk.CollectionConverters._

import org.apache.hadoop.conf.Configuration
import org.scalatest.funsuite.AnyFunSuite

import heapstate.StoreFixture._

class CheckpointInspectorSuite extends AnyFunSuite {
  private type Obj = java.util.Map[String, AnyRef]
  private def list(o: Obj, k: String): Seq[Obj] = o.get(k).asInstanceOf[java.util.List[Obj]].asScala.toSeq

  test("describes files, recovery chains, and damage") {
    val checkpoint = tempDir()
    val root = s"$checkpoint/state"
    val p = provider(root, Map("spark.sql.streaming.stateStore.heapstate.compactionInterval" -> "3"))
    // Versions 1..7, snapshots at 3 and 6. The last commit runs no maintenance, and commits hand
    // no cleanup to the background: at version 7 a cleanup would delete snapshot 3, since snapshot
    // 6 and the journals rebuild what it held.
    p.cleanupAfterSnapshots = false
    for (v <- 0 until 7) {
      val s = p.getStore(v, None, false, false); put(s, v, v); put(s, 100, v); s.commit()
      if (v < 6) p.doMaintenance()
    }
    val dir = storeDir(root)
    def describe() = CheckpointInspector.describe(checkpoint, verify = true, new Configuration())
    val stores = list(describe(), "stores")
    assert(stores.size == 1)
    val store = stores.head
    assert(store.get("operator") == java.lang.Long.valueOf(0) && store.get("partition") == Integer.valueOf(
      0) && store.get("store") == "default")
    val files = list(store, "files").map(f => f.get("name") -> (f.get("status"), f.get("records"))).toMap
    assert(files("1.hs-journal") == (("ok", java.lang.Long.valueOf(2))))
    assert(files("6.hs-snapshot") == (("ok", java.lang.Long.valueOf(7))))
    val versions = list(store, "versions").map(v =>
      v.get("version").asInstanceOf[java.lang.Long].longValue -> (v.get("recoversFrom"), v.get("journalChain"))).toMap
    assert(versions(2L) == (("empty", java.lang.Long.valueOf(2))))
    assert(versions(5L) == (("3.hs-snapshot", java.lang.Long.valueOf(2))))
    assert(versions(7L) == (("6.hs-snapshot", java.lang.Long.valueOf(1))))

    val raf = new RandomAccessFile(new File(dir, "5.hs-journal"), "rw"); raf.setLength(raf.length() - 2); raf.close()
    val snap = new RandomAccessFile(new File(dir, "6.hs-snapshot"), "rw"); snap.seek(0); snap.write('X'); snap.close()
    val damaged = list(describe(), "stores").head
    val status = list(damaged, "files").map(f => f.get("name") -> f.get("status")).toMap
    assert(status("5.hs-journal") == "corrupt" && status("6.hs-snapshot") == "corrupt")
    val v = list(damaged, "versions").map(x => x.get("version").asInstanceOf[java.lang.Long].longValue -> x).toMap
    assert(v(4L).get("recoversFrom") == "3.hs-snapshot")
    assert(v(5L).get("recoverable") == java.lang.Boolean.FALSE)
    assert(v(5L).get("problem").toString.contains("5.hs-journal") && v(5L).get("problem").toString.contains("damaged"))
    assert(v(7L).get("recoverable") == java.lang.Boolean.FALSE, "6.hs-snapshot is damaged and journal 5 too")
    assert(CheckpointInspector.describeJson(checkpoint, verify = true).contains("\"corrupt\""))
  }
}
