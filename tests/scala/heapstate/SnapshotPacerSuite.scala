package heapstate

import org.scalatest.funsuite.AnyFunSuite

import heapstate.engine.SnapshotPacer

/** The background snapshot's pacing, on a fake clock. */
class SnapshotPacerSuite extends AnyFunSuite {
  private val MiB = 1 << 20
  private val Ms = 1000000L

  /**
   * A pacer on clocks that only move when the test works (`work`) or the pacer parks: the wall
   * clock by the work and any wait for a core, the thread's CPU clock by the work alone.
   */
  private final class Rig(dutyCycle: Double, abandonAfterParks: Int = Int.MaxValue) {
    var now = 0L
    var cpu = 0L
    var abandonNow = false
    val parks = scala.collection.mutable.ArrayBuffer.empty[Long]
    val pacer = new SnapshotPacer(
      dutyCycle,
      abandon = () => abandonNow || parks.length >= abandonAfterParks,
      clock = () => now,
      park = n => { parks += n; now += n },
      cpuClock = () => cpu)
    /** Works `ms` milliseconds of CPU, after waiting `waitedMs` for a core, then reports `bytes` written. */
    def work(ms: Long, bytes: Int = MiB, waitedMs: Long = 0): Unit = {
      now += (ms + waitedMs) * Ms; cpu += ms * Ms; pacer.wrote(bytes)
    }
  }

  test("after each MiB a snapshot rests so that it works its duty cycle: a third rests twice its work") {
    val rig = new Rig(1.0 / 3)
    rig.work(10)
    rig.work(30)
    assert(rig.parks == Seq(20 * Ms, 60 * Ms))
    assert(rig.now == 120 * Ms)
  }

  test("time spent waiting for a core is not work: the rest completes the cycle the CPU time asks for") {
    val rig = new Rig(1.0 / 3)
    rig.work(10, waitedMs = 15) // 10 ms of CPU in 25 ms: the cycle lasts 30 ms
    rig.work(10, waitedMs = 30) // 10 ms of CPU in 40 ms: already past its 30 ms, no rest
    rig.work(10)
    assert(rig.parks == Seq(5 * Ms, 20 * Ms))
    assert(rig.cpu == 30 * Ms && rig.now == 100 * Ms)
  }

  test("the work of a chunk counts from the end of the last rest, across small writes") {
    val rig = new Rig(0.5)
    rig.work(4, MiB / 2)
    assert(rig.parks.isEmpty, "half a MiB: no rest yet")
    rig.work(6, MiB / 2)
    assert(rig.parks == Seq(10 * Ms))
  }

  test("a duty cycle of 1 never rests") {
    val rig = new Rig(1.0)
    for (_ <- 1 to 3) rig.work(10)
    assert(rig.parks.isEmpty && rig.now == 30 * Ms)
  }

  test("a snapshot gives up at its next pause when a task needs the state, before or after resting") {
    val before = new Rig(1.0 / 3)
    before.abandonNow = true
    intercept[SnapshotPacer.Abandoned](before.work(10))
    assert(before.parks.isEmpty)
    val after = new Rig(1.0 / 3, abandonAfterParks = 1)
    intercept[SnapshotPacer.Abandoned](after.work(10))
    assert(after.parks == Seq(20 * Ms))
  }

  test("a duty cycle outside (0, 1] is refused") {
    intercept[IllegalArgumentException](new SnapshotPacer(0, () => false))
    intercept[IllegalArgumentException](new SnapshotPacer(1.5, () => false))
  }
}
