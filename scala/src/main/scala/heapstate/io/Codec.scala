package heapstate.io

import java.io.{IOException, InputStream, OutputStream}

import com.github.luben.zstd.{ZstdCompressCtx, ZstdDecompressCtx, ZstdInputStreamNoFinalizer, ZstdOutputStreamNoFinalizer}
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
    def compress(out: OutputStream): OutputStream = new ZstdOutputStreamNoFinalizer(out, 1)
    def decompress(in: InputStream): InputStream = new ZstdInputStreamNoFinalizer(in)
    def blocks(): BlockCodec = new BlockCodec {
      // zstd-jni's contexts hold native memory and have no finalizer: created when first needed, freed by close.
      private var cctx: ZstdCompressCtx = _
      private var dctx: ZstdDecompressCtx = _
      def maxCompressedLength(n: Int): Int = Math.toIntExact(com.github.luben.zstd.Zstd.compressBound(n.toLong))
      def compress(src: Array[Byte], len: Int, dst: Array[Byte]): Int = {
        if (cctx == null) { cctx = new ZstdCompressCtx(); cctx.setLevel(1); cctx.setMinMatch(BlockMinMatch) }
        cctx.compressByteArray(dst, 0, dst.length, src, 0, len)
      }
      def decompress(src: Array[Byte], srcOff: Int, srcLen: Int, dst: Array[Byte], rawLen: Int): Unit = {
        if (dctx == null) dctx = new ZstdDecompressCtx()
        requireLength(dctx.decompressByteArray(dst, 0, rawLen, src, srcOff, srcLen), rawLen)
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
      def compress(src: Array[Byte], len: Int, dst: Array[Byte]): Int = org.xerial.snappy.Snappy.compress(src, 0, len, dst, 0)
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
