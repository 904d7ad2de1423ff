package heapstate

import org.scalatest.funsuite.AnyFunSuite

import heapstate.engine.MachineLoad

/** Reading Linux's count of runnable threads, which background snapshots wait on. */
class MachineLoadSuite extends AnyFunSuite {
  private def runnable(line: String): Int = {
    val bytes = line.getBytes("US-ASCII")
    MachineLoad.runnable(bytes, bytes.length)
  }

  test("the runnable count is the fourth field's first number") {
    assert(runnable("0.52 0.58 0.59 3/415 12345\n") == 3)
    assert(runnable("12.00 11.50 10.25 117/2048 99\n") == 117)
    assert(runnable("0.00 0.00 0.00 0/1 1") == 0)
  }

  test("a line without a runnable count reads as -1, which never holds every core") {
    assert(runnable("") == -1)
    assert(runnable("0.52 0.58 0.59") == -1)
    assert(runnable("0.52 0.58 0.59 3") == -1, "no total after it: a truncated read")
    assert(runnable("0.52 0.58 0.59 x/415 1") == -1)
  }

  test("processor lists count every processor of their ranges") {
    assert(MachineLoad.cpuCount("0-1\n") == 2)
    assert(MachineLoad.cpuCount("0") == 1)
    assert(MachineLoad.cpuCount("0-3,8-11\n") == 8)
    assert(MachineLoad.cpuCount("0,2,4-5") == 4)
    intercept[NumberFormatException](MachineLoad.cpuCount("0-1-2"))
    intercept[NumberFormatException](MachineLoad.cpuCount("zero"))
  }

  test("on Linux with every processor its own, this JVM sees others hold every core while they spin") {
    assume(MachineLoad.available, "/proc/loadavg is not read here (not Linux, or a JVM held to fewer processors)")
    val cores = Runtime.getRuntime.availableProcessors
    @volatile var stop = false
    val spinners = (1 to 2 * cores).map(_ => new Thread(() => { while (!stop) {} }))
    spinners.foreach(_.start())
    try {
      val until = System.nanoTime() + 2000L * 1000 * 1000
      var seen = false
      while (!seen && System.nanoTime() < until) {
        seen = MachineLoad.othersHoldEveryCore()
        Thread.sleep(2)
      }
      assert(seen, s"${2 * cores} spinning threads on $cores processors never seen to hold every core in 2 s")
    } finally {
      stop = true
      spinners.foreach(_.join())
    }
  }
}
