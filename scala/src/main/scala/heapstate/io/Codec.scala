package heapstate.io

import java.io.{IOException, InputStream, OutputStream}

import com.github.luben.zstd.{EndDirective, ZstdCompressCtx, ZstdDecompressCtx, ZstdInputStreamNoFinalizer}
import net.jpountz.lz4.{LZ4BlockInputStream, LZ4BlockOutputStream, LZ4Factory}
import org.xerial.snappy.{SnappyInputStream, SnappyOutputStream}

/**
 * Compression codecs for the body of a state file. Each has a stable one-byte id, written in the
 * file header, so a file is always read with the codec it was written with, whatever the
 * configuration says today. The libraries are the ones Spark itself ships.
 *
 * A codec compresses a stream (a journal's body) or single blocks ([[BlockCodec]]: a snapshot's
 * buckets, each compressed on its own so that any one can be read without the others).
 */
sealed abstract class Codec(val id: Byte, val name: String) {
  def compress(out: OutputStream): OutputStream
  def decompress(in: InputStream): InputStream
  /** A compressor and decompressor of whole blocks, for one thread at a time; close it after use. */
  def blocks(): BlockCodec

  /**
   * [[blocks]] whose blocks are compressed with `dictionary` (null: none), which reading them then
   * needs too. Only zstd takes one (see `Codec.Zstd`).
   */
  def blocks(dictionary: Array[Byte]): BlockCodec =
    if (dictionary == null) blocks() else throw new IllegalArgumentException(s"codec $name takes no dictionary")
}

/**
 * Compresses and decompresses whole blocks in one call each. An instance may hold native state
 * (zstd's contexts, reused from block to block): use it from one thread at a time, and close it.
 */
abstract class BlockCodec extends AutoCloseable {
  /** The largest compressed size of `n` bytes: the room `compress` needs. */
  def maxCompressedLength(n: Int): Int

  /** Compresses `src(0 until len)` into `dst` (at least `maxCompressedLength(len)` long); returns the compressed length. */
  def compress(src: Array[Byte], len: Int, dst: Array[Byte]): Int

  /** Decompresses `srcLen` bytes at `src(srcOff)` into exactly `rawLen` bytes at `dst(0)`; throws unless they decompress to exactly that. */
  def decompress(src: Array[Byte], srcOff: Int, srcLen: Int, dst: Array[Byte], rawLen: Int): Unit

  override def close(): Unit = ()

  protected def requireLength(got: Int, rawLen: Int): Unit =
    if (got != rawLen) throw new IOException(s"a block decompressed to $got bytes instead of $rawLen")
}

/**
 * The two direct buffers a [[BlockCodec]] hands a native compressor instead of heap arrays, and
 * the copies in and out (a few KiB per bucket, against the compression itself).
 *
 * Why: zstd-jni's byte-array calls read the arrays in place, pinned with JNI's
 * GetPrimitiveArrayCritical, and no garbage collection may run until they let go; one that must
 * wait runs afterwards as a "GCLocker Initiated GC". G1 undoes a concurrent cycle it started on
 * a humongous allocation when the old generation turns out to be below its threshold, but only
 * when the pause that started it was caused by that allocation. Started by a GCLocker pause, the
 * cycle marks the whole heap: in W1 on two cores, cycles of 455 and 552 ms inside one batch.
 * Direct buffers take no lock: the native code gets their addresses.
 */
final class DirectBlocks {
  private var in: java.nio.ByteBuffer = java.nio.ByteBuffer.allocateDirect(0)
  private var out: java.nio.ByteBuffer = java.nio.ByteBuffer.allocateDirect(0)

  private def room(b: java.nio.ByteBuffer, n: Int): java.nio.ByteBuffer =
    if (b.capacity >= n) b
    else java.nio.ByteBuffer.allocateDirect(math.max(n, math.min(Int.MaxValue / 2, b.capacity) * 2))

  /** The direct input buffer, holding `len` bytes copied from `src(off)` at its start. */
  def input(src: Array[Byte], off: Int, len: Int): java.nio.ByteBuffer = {
    in = room(in, len)
    in.put(0, src, off, len)
    in
  }

  /** The direct output buffer, with room for at least `n` bytes. */
  def output(n: Int): java.nio.ByteBuffer = { out = room(out, n); out }

  /** Copies the `n` bytes the native call wrote at the output's start into `dst`; returns `n`. */
  def result(n: Int, dst: Array[Byte]): Int = { out.get(0, dst, 0, n); n }
}

/**
 * A zstd stream (one frame, level 1) written through direct buffers, for the same reason as
 * [[DirectBlocks]]: zstd-jni's own output stream pins the caller's arrays in every call, and a
 * commit's journal is compressed on the task thread. Any zstd stream reader reads the frame.
 * `close` ends the frame and closes `out`.
 *
 * The context and buffers come from a small pool ([[DirectZstdOutput.Kit]]): every commit writes
 * a journal, and a fresh context allocates and clears zstd's tables on its first call, besides
 * two direct buffers that only a garbage collection gives back.
 */
final class DirectZstdOutput(out: OutputStream) extends OutputStream {
  private val kit = DirectZstdOutput.take()
  private val ctx = kit.ctx
  private val in = kit.in
  private val compressed = kit.compressed
  private val copy = kit.copy
  private var closed = false

  override def write(b: Int): Unit = {
    ensureOpen()
    if (!in.hasRemaining) compress(EndDirective.CONTINUE)
    in.put(b.toByte)
  }

  override def write(b: Array[Byte], off: Int, len: Int): Unit = {
    java.util.Objects.checkFromIndexSize(off, len, b.length)
    ensureOpen()
    var at = off
    var left = len
    while (left > 0) {
      if (!in.hasRemaining) compress(EndDirective.CONTINUE)
      val n = math.min(left, in.remaining)
      in.put(b, at, n)
      at += n
      left -= n
    }
  }

  private def ensureOpen(): Unit = if (closed) throw new IOException("the zstd stream is closed")

  /** Compresses what `in` holds with `op`, and writes all the output that produces to `out`. */
  private def compress(op: EndDirective): Unit = {
    ensureOpen()
    in.flip()
    var done = false
    while (!done) {
      compressed.clear()
      val complete = ctx.compressDirectByteBufferStream(compressed, in, op)
      compressed.flip()
      val n = compressed.remaining
      compressed.get(copy, 0, n)
      out.write(copy, 0, n)
      done = if (op == EndDirective.CONTINUE) !in.hasRemaining else complete
    }
    in.clear()
  }

  override def flush(): Unit = { compress(EndDirective.FLUSH); out.flush() }

  override def close(): Unit = if (!closed) {
    var ended = false
    try { compress(EndDirective.END); ended = true; out.close() }
    finally {
      closed = true
      // A context whose frame did not end cleanly is not reused.
      if (ended) DirectZstdOutput.give(kit) else ctx.close()
    }
  }
}

object DirectZstdOutput {
  /** Input gathered before each call into zstd. */
  val InputBytes: Int = 128 * 1024

  /**
   * A zstd context at level 1 and the buffers a stream uses with it; one stream at a time. A kit
   * is given back only after its frame ended, and `compress` clears `in` after every call.
   */
  private[io] final class Kit {
    val ctx = new ZstdCompressCtx()
    ctx.setLevel(1)
    val in: java.nio.ByteBuffer = java.nio.ByteBuffer.allocateDirect(InputBytes)
    val compressed: java.nio.ByteBuffer = java.nio.ByteBuffer.allocateDirect(
      Math.toIntExact(com.github.luben.zstd.Zstd.compressBound(InputBytes.toLong)))
    val copy = new Array[Byte](compressed.capacity)
  }

  /** Kits kept for reuse, at most 4: about one per task thread writing journals at once. */
  private val idle = new java.util.concurrent.ArrayBlockingQueue[Kit](4)

  private def take(): Kit = { val k = idle.poll(); if (k == null) new Kit else k }

  /** Returns a kit whose last frame ended: kept for the next stream, or closed when enough are kept. */
  private def give(k: Kit): Unit = if (!idle.offer(k)) k.ctx.close()

  /** How many kits wait for reuse (tests). */
  private[heapstate] def idleKits: Int = idle.size
}

object Codec {
  case object NoCompression extends Codec(0, "none") {
    def compress(out: OutputStream): OutputStream = out
    def decompress(in: InputStream): InputStream = in
    def blocks(): BlockCodec = new BlockCodec {
      def maxCompressedLength(n: Int): Int = n
      def compress(src: Array[Byte], len: Int, dst: Array[Byte]): Int = { System.arraycopy(src, 0, dst, 0, len); len }
      def decompress(src: Array[Byte], srcOff: Int, srcLen: Int, dst: Array[Byte], rawLen: Int): Unit = {
        requireLength(srcLen, rawLen)
        System.arraycopy(src, srcOff, dst, 0, srcLen)
      }
    }
  }
  case object Zstd extends Codec(1, "zstd") {
    /**
     * The shortest match level 1 looks for in a snapshot's buckets: 7 bytes, which zstd's level 1
     * uses for inputs above 256 KiB, instead of the 5 it picks for a block of at most 16 KiB (6 up
     * to 256 KiB). Its hash table then finds fewer short matches to try, and these buckets (key
     * rows and value rows) gain little from them: on 80 MB of W1-shaped records in 8 KiB blocks,
     * 163 ms instead of 196, and 0.492 of the bytes instead of 0.486. Only the compressor's search
     * changes: the frames are the same format and any zstd reads them.
     */
    val BlockMinMatch = 7
    def compress(out: OutputStream): OutputStream = new DirectZstdOutput(out)
    def decompress(in: InputStream): InputStream = new ZstdInputStreamNoFinalizer(in)
    def blocks(): BlockCodec = blocks(null)

    /**
     * Blocks compressed with a dictionary trained on a snapshot's own buckets (see
     * `SnapshotFileWriter`), or without one when `dictionary` is null. With one, a frame records
     * neither its content size nor the dictionary's id (a snapshot's index holds each bucket's raw
     * length, and its file the dictionary): about 6 bytes less on buckets of a few hundred.
     */
    override def blocks(dictionary: Array[Byte]): BlockCodec = new BlockCodec {
      // zstd-jni's contexts hold native memory and have no finalizer: created when first needed, freed by close.
      private var cctx: ZstdCompressCtx = _
      private var dctx: ZstdDecompressCtx = _
      // The blocks go through direct buffers, not zstd-jni's byte-array calls: those pin the
      // arrays with JNI's GetPrimitiveArrayCritical, which holds off every garbage collection
      // while zstd runs (most of a snapshot's time; see DirectBlocks for what that cost).
      private val io = new DirectBlocks
      def maxCompressedLength(n: Int): Int = Math.toIntExact(com.github.luben.zstd.Zstd.compressBound(n.toLong))
      def compress(src: Array[Byte], len: Int, dst: Array[Byte]): Int = {
        if (cctx == null) {
          cctx = new ZstdCompressCtx(); cctx.setLevel(1); cctx.setMinMatch(BlockMinMatch)
          if (dictionary != null) { cctx.setContentSize(false); cctx.setDictID(false); cctx.loadDict(dictionary) }
        }
        val in = io.input(src, 0, len)
        val out = io.output(dst.length)
        io.result(cctx.compressDirectByteBuffer(out, 0, dst.length, in, 0, len), dst)
      }
      def decompress(src: Array[Byte], srcOff: Int, srcLen: Int, dst: Array[Byte], rawLen: Int): Unit = {
        if (dctx == null) { dctx = new ZstdDecompressCtx(); if (dictionary != null) dctx.loadDict(dictionary) }
        val in = io.input(src, srcOff, srcLen)
        val out = io.output(rawLen)
        requireLength(io.result(dctx.decompressDirectByteBuffer(out, 0, rawLen, in, 0, srcLen), dst), rawLen)
      }
      override def close(): Unit = {
        if (cctx != null) { cctx.close(); cctx = null }
        if (dctx != null) { dctx.close(); dctx = null }
      }
    }
  }
  case object Lz4 extends Codec(2, "lz4") {
    def compress(out: OutputStream): OutputStream = new LZ4BlockOutputStream(out, 64 * 1024)
    def decompress(in: InputStream): InputStream = LZ4BlockInputStream.newBuilder().build(in)
    def blocks(): BlockCodec = new BlockCodec {
      private val lz4 = LZ4Factory.fastestInstance()
      def maxCompressedLength(n: Int): Int = lz4.fastCompressor().maxCompressedLength(n)
      def compress(src: Array[Byte], len: Int, dst: Array[Byte]): Int =
        lz4.fastCompressor().compress(src, 0, len, dst, 0, dst.length)
      def decompress(src: Array[Byte], srcOff: Int, srcLen: Int, dst: Array[Byte], rawLen: Int): Unit =
        requireLength(lz4.safeDecompressor().decompress(src, srcOff, srcLen, dst, 0, rawLen), rawLen)
    }
  }
  case object Snappy extends Codec(3, "snappy") {
    def compress(out: OutputStream): OutputStream = new SnappyOutputStream(out)
    def decompress(in: InputStream): InputStream = new SnappyInputStream(in)
    def blocks(): BlockCodec = new BlockCodec {
      def maxCompressedLength(n: Int): Int = org.xerial.snappy.Snappy.maxCompressedLength(n)
      def compress(src: Array[Byte], len: Int, dst: Array[Byte]): Int =
        org.xerial.snappy.Snappy.compress(src, 0, len, dst, 0)
      def decompress(src: Array[Byte], srcOff: Int, srcLen: Int, dst: Array[Byte], rawLen: Int): Unit = {
        // Checked first: snappy writes as many bytes as the block's own header says.
        requireLength(org.xerial.snappy.Snappy.uncompressedLength(src, srcOff, srcLen), rawLen)
        requireLength(org.xerial.snappy.Snappy.uncompress(src, srcOff, srcLen, dst, 0), rawLen)
      }
    }
  }

  val all: Seq[Codec] = Seq(Zstd, Lz4, Snappy, NoCompression)

  def byName(name: String): Option[Codec] = all.find(_.name == name.trim.toLowerCase)
  def byId(id: Byte): Option[Codec] = all.find(_.id == id)
}
