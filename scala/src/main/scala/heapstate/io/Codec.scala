package heapstate.io

import java.io.{InputStream, OutputStream}

import com.github.luben.zstd.{ZstdInputStreamNoFinalizer, ZstdOutputStreamNoFinalizer}
import net.jpountz.lz4.{LZ4BlockInputStream, LZ4BlockOutputStream}
import org.xerial.snappy.{SnappyInputStream, SnappyOutputStream}

/**
 * Compression codecs for the body of a state file. Each has a stable one-byte id, written in the
 * file header, so a file is always read with the codec it was written with, whatever the
 * configuration says today. The libraries are the ones Spark itself ships.
 */
sealed abstract class Codec(val id: Byte, val name: String) {
  def compress(out: OutputStream): OutputStream
  def decompress(in: InputStream): InputStream
}

object Codec {
  case object NoCompression extends Codec(0, "none") {
    def compress(out: OutputStream): OutputStream = out
    def decompress(in: InputStream): InputStream = in
  }
  case object Zstd extends Codec(1, "zstd") {
    def compress(out: OutputStream): OutputStream = new ZstdOutputStreamNoFinalizer(out, 1)
    def decompress(in: InputStream): InputStream = new ZstdInputStreamNoFinalizer(in)
  }
  case object Lz4 extends Codec(2, "lz4") {
    def compress(out: OutputStream): OutputStream = new LZ4BlockOutputStream(out, 64 * 1024)
    def decompress(in: InputStream): InputStream = LZ4BlockInputStream.newBuilder().build(in)
  }
  case object Snappy extends Codec(3, "snappy") {
    def compress(out: OutputStream): OutputStream = new SnappyOutputStream(out)
    def decompress(in: InputStream): InputStream = new SnappyInputStream(in)
  }

  val all: Seq[Codec] = Seq(Zstd, Lz4, Snappy, NoCompression)

  def byName(name: String): Option[Codec] = all.find(_.name == name.trim.toLowerCase)
  def byId(id: Byte): Option[Codec] = all.find(_.id == id)
}
