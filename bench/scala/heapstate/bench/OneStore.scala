package heapstate.bench

import org.apache.spark.unsafe.Platform

import heapstate.engine.{ChangeSet, Entry, Key, LiveState}

/**
 * One W1-shaped store in a [[LiveState]] alone, for the benchmarks that measure the live table
 * without Spark: `keys` keys, each a 16-byte key row (one long) with a random value row of
 * `valueBytes` bytes, loaded in one commit as version 1.
 */
private[bench] final class OneStore(val keys: Int, val valueBytes: Int) {
  val rnd = new scala.util.Random(7)

  /** An UnsafeRow of one long: the null bits, then the long. */
  def keyBytes(k: Int): Array[Byte] = {
    val b = new Array[Byte](16)
    Platform.putLong(b, Platform.BYTE_ARRAY_OFFSET + 8, k.toLong)
    b
  }

  def value(): Array[Byte] = { val v = new Array[Byte](valueBytes); rnd.nextBytes(v); v }

  /** A change set of `updates` updates of random keys (a key drawn twice is updated once), each to a new random value. */
  def randomChanges(updates: Int): ChangeSet = {
    val changes = new ChangeSet(live)
    for (_ <- 0 until updates) {
      val k = rnd.nextInt(keys)
      changes.put(Key(keyBytes(k)), Entry(keyBytes(k), value()))
    }
    changes
  }

  val live: LiveState = {
    val st = new LiveState(None, 0, keys)
    val first = new ChangeSet(st)
    (0 until keys).foreach(k => first.put(Key(keyBytes(k)), Entry(keyBytes(k), value())))
    st.applyCommit(st.prepareCommit(first), 0, inPlace = true)
    first.release() // the table holds copies; the change set must not keep its entries alive
    st
  }
}

private[bench] object OneStore {
  /**
   * W1's value row, in bytes: the aggregation buffer of `last(v)` and `count(*)` (the last value,
   * whether one was set, the count) as an UnsafeRow: 8 bytes of null bits, 8 for each of the three
   * fields, and the 256 characters of the string. With the key row's 16, the 304 raw bytes per key
   * that the README's memory figures count.
   */
  val W1ValueBytes = 288
  /** W5's value row, in bytes: as W1's (see [[W1ValueBytes]]) with 64 characters. */
  val W5ValueBytes = 96

  /** A store of `--keys` keys (250,000: a quarter of W1's) with `--value-bytes` value rows. */
  def apply(opts: Map[String, String], defaultValueBytes: Int): OneStore =
    new OneStore(opts.getOrElse("keys", "250000").toInt,
      opts.getOrElse("value-bytes", defaultValueBytes.toString).toInt)
}
