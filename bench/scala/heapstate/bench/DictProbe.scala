package heapstate.bench

import com.github.luben.zstd.{ZstdCompressCtx, ZstdDictCompress, ZstdDictTrainer}

/**
 * What a snapshot's bucket costs zstd, and how well it compresses, by bucket size, with and without
 * a dictionary trained on the buckets (stop 65, which chose buckets of 1 KiB and a dictionary of
 * 16 KiB trained on a few hundred of them; see `SnapshotFileWriter.train`). `n` records shaped as
 * [[RestartLoad]]'s (a long key, a value with 64 hex characters), in hash order as in a
 * snapshot's buckets, cut into blocks of about each size; each block compressed on its own at
 * level 1, as `Codec.Zstd` does. A dictionary size below 0 is raw content (records as they are,
 * not trained). Prints the compressed share of the bytes, the time per block and per record, and
 * the training's time.
 * {{{
 *   bin/sbt "bench/runMain heapstate.bench.DictProbe 250000"
 * }}}
 */
object DictProbe {
  def main(args: Array[String]): Unit = {
    val n = args.headOption.map(_.toInt).getOrElse(1000000)
    val recs = Array.tabulate(n) { k =>
      val key = RestartLoad.key(k.toLong).getBytes; val value = RestartLoad.value(k.toLong, 1, 64).getBytes
      val r = new Array[Byte](9 + key.length + value.length)
      val bb = java.nio.ByteBuffer.wrap(r); bb.put(1.toByte).putInt(key.length).put(key).putInt(value.length).put(value)
      r
    }
    // hash order, as in a snapshot's buckets
    val sorted = recs.sortBy(r =>
      heapstate.io.StateFileFormat.keyHash(r, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + 5,
        java.nio.ByteBuffer.wrap(r).getInt(1)) ^ Int.MinValue)
    System.arraycopy(sorted, 0, recs, 0, n)
    val recBytes = recs.map(_.length.toLong).sum
    println(s"$n records, ${recBytes / n} bytes each")
    for (bucketBytes <- Seq(4096, 1024, 512)) {
      val blocks = recs.grouped(math.max(1, bucketBytes / recs(0).length)).map(g => g.flatten).toArray
      for ((dictBytes, samples) <- Seq((0, 0), (16384, 2000), (16384, 300), (-16384, 0), (8192, 300))) {
        val ctx = new ZstdCompressCtx(); ctx.setLevel(1); ctx.setMinMatch(7)
        var trainMs = 0.0
        if (dictBytes < 0) {
          val t0 = System.nanoTime()
          val raw = new java.io.ByteArrayOutputStream(); val rnd = new java.util.Random(3)
          while (raw.size < -dictBytes) raw.write(recs(rnd.nextInt(n)))
          ctx.loadDict(new ZstdDictCompress(raw.toByteArray, 1))
          trainMs = (System.nanoTime() - t0) / 1e6
        } else if (dictBytes > 0) {
          val t0 = System.nanoTime()
          val trainer = new ZstdDictTrainer(2 << 20, dictBytes)
          val rnd = new java.util.Random(3)
          var i = 0; while (i < samples) { trainer.addSample(blocks(rnd.nextInt(blocks.length))); i += 1 }
          val dict = trainer.trainSamples()
          ctx.loadDict(new ZstdDictCompress(dict, 1))
          trainMs = (System.nanoTime() - t0) / 1e6
        }
        ctx.setContentSize(false); ctx.setDictID(false)
        val dst = new Array[Byte](bucketBytes * 4 + 1024)
        def pass(): (Long, Double) = {
          var out = 0L; val t0 = System.nanoTime(); var i = 0
          while (i < blocks.length) { out += ctx.compress(dst, blocks(i)).toLong; i += 1 }
          (out, (System.nanoTime() - t0) / 1e6)
        }
        pass(); pass()
        val (out, ms) = pass()
        println(
          f"bucket $bucketBytes%5d dict $dictBytes%6d/$samples%4d: ${blocks.length}%7d blocks, ratio ${out.toDouble / recBytes}%.3f, " +
            f"$ms%7.1f ms all, ${ms * 1e6 / blocks.length}%6.0f ns/block, ${ms * 1e6 / n}%5.0f ns/record, train $trainMs%.0f ms")
        ctx.close()
      }
    }
  }
}
