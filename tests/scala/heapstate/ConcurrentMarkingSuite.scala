package heapstate

import org.scalatest.funsuite.AnyFunSuite

import heapstate.engine.ConcurrentMarking

/** Finding G1's concurrent marking at work, which background snapshots wait for. */
class ConcurrentMarkingSuite extends AnyFunSuite {
  private def state(line: String): Char = {
    val bytes = line.getBytes("UTF-8")
    ConcurrentMarking.stateOf(bytes, bytes.length)
  }

  test("a thread's state is the field after its name, whatever the name holds") {
    assert(state("4242 (G1 Conc#0) R 1 4242 4242 0 -1 4194368 0 0") == 'R')
    assert(state("4243 (G1 Main Marker) S 1 4242") == 'S')
    assert(state("4244 (odd) name) (x) D 1 2 3") == 'D')
    assert(state("") == '?')
    assert(state("4245 (cut") == '?')
    assert(state("4245 (cut)") == '?')
  }

  test("G1's marking threads are named as HotSpot names them; its other threads are not marking") {
    assert(ConcurrentMarking.isMarker("G1 Main Marker"))
    assert(ConcurrentMarking.isMarker("G1 Conc#0") && ConcurrentMarking.isMarker("G1 Conc#12"))
    Seq("G1 Refine#0", "G1 Service", "GC Thread#0", "C2 CompilerThre", "Executor task launch worker")
      .foreach(n => assert(!ConcurrentMarking.isMarker(n), n))
  }

  test("on Linux under G1, a JVM sees its marking cycle running, and not its idle collector") {
    assume(new java.io.File("/proc/self/task").isDirectory, "no /proc/self/task: not Linux")
    // A JVM of its own, whose System.gc() starts a concurrent cycle (-XX:+ExplicitGCInvokesConcurrent).
    val javaBin = new java.io.File(System.getProperty("java.home"), "bin/java").getPath
    val command = Seq(javaBin, "-XX:+UseG1GC", "-XX:+ExplicitGCInvokesConcurrent", "-Xmx512m", "-cp",
      System.getProperty("java.class.path"), "heapstate.ConcurrentMarkingProbe")
    val process = new ProcessBuilder(command: _*).redirectErrorStream(true).start()
    val out = scala.io.Source.fromInputStream(process.getInputStream).mkString
    assert(process.waitFor() == 0, out)
    assert(out.contains("idle: not running") && out.contains("cycle: seen running"), out)
  }
}

/** Run by [[ConcurrentMarkingSuite]] in a JVM of its own (see there). */
object ConcurrentMarkingProbe {
  def main(args: Array[String]): Unit = {
    require(ConcurrentMarking.available, "G1's marking threads not found")
    // Many small objects, for a marking cycle that lasts long enough to be seen.
    val keep = Array.fill(2000000)(new Array[Long](2))
    System.gc()
    Thread.sleep(500) // the cycle of the first System.gc() ends
    var idle = true
    var i = 0
    while (i < 200) { if (ConcurrentMarking.running()) idle = false; Thread.sleep(1); i += 1 }
    println(if (idle) "idle: not running" else "idle: running while no cycle was asked for")
    var seen = false
    var tries = 0
    while (!seen && tries < 20) {
      System.gc()
      val until = System.nanoTime() + 200L * 1000 * 1000
      while (!seen && System.nanoTime() < until) seen = ConcurrentMarking.running()
      tries += 1
    }
    println(if (seen) s"cycle: seen running (try $tries)" else "cycle: never seen running")
    println(keep.length)
  }
}
