package heapstate

import java.net.URI
import java.nio.file.attribute.PosixFilePermission

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{
  ChecksumFs,
  DelegateToFileSystem,
  FileStatus,
  FsConstants,
  FsServerDefaults,
  Path,
  RawLocalFileSystem
}
import org.apache.hadoop.fs.local.LocalConfigKeys
import org.apache.hadoop.fs.permission.FsPermission

/**
 * Hadoop's local disk for `FileContext` (its `LocalFs`), without the processes it forks: the
 * Scala tests' `core-site.xml` names it for `file:` (`fs.AbstractFileSystem.file.impl`), under
 * Spark's default checkpoint manager on a local path, the FileContext-based one. Without Hadoop's
 * native library, `LocalFs` forks a `chmod` for every file and directory it creates and a
 * `readlink` for each side of every rename (and of its `.crc` file's). Measured alone on 2 cores
 * (stop 59): the Scala suites forked 81,578 processes and ran for 389 s; with this, 675 and 165 s.
 * The randomized model tests took 56, 83, 61 and 51 s against 10, 11, 9 and 13: their re-run
 * versions replaced journals, which heapstate wrote through Spark's manager until stop 60 (it now
 * replaces them with its own), and the test off the local disk writes every file through it.
 *
 * The same checksummed layer over the same raw local file system, with two methods replaced by
 * their Java equivalents: `setPermission` sets the same mode bits through `java.nio`, and
 * `getFileLinkStatus` of a path that is not a symbolic link is its `getFileStatus`, which is what
 * Hadoop returns once `readlink` prints nothing. heapstate's local files do not go through here
 * (they take its own manager, `StateFiles.fastLocalManager`); its files off the local disk in the
 * tests (`StoreFixture.FileContextManager`), Spark's offset and commit logs and the HDFS
 * provider's files do. One thing tells it from Hadoop's: Spark's FileContext manager's
 * `isLocal`, which names Hadoop's two classes, is false here; nothing in Spark's streaming or in
 * heapstate asks it (heapstate asks `StateFiles.localFileSystem`).
 *
 * `uri` and `conf`: the constructor Hadoop's `AbstractFileSystem.createFileSystem` calls.
 */
final class NoForkLocalFs(uri: URI, conf: Configuration) extends ChecksumFs(new NoForkLocalFs.Raw(conf))

object NoForkLocalFs {
  /**
   * Hadoop's `RawLocalFs` (whose constructors are not public) over [[RawFileSystem]]; like it, on
   * `file:///` whatever the URI [[NoForkLocalFs]] is given.
   */
  final class Raw(conf: Configuration)
      extends DelegateToFileSystem(
        FsConstants.LOCAL_FS_URI, new RawFileSystem, conf, FsConstants.LOCAL_FS_URI.getScheme, false) {
    override def getUriDefaultPort: Int = -1
    override def getServerDefaults(f: Path): FsServerDefaults = LocalConfigKeys.getServerDefaults()
    @deprecated("as Hadoop's", "") override def getServerDefaults(): FsServerDefaults =
      LocalConfigKeys.getServerDefaults()
    override def isValidName(src: String): Boolean = true
  }

  final class RawFileSystem extends RawLocalFileSystem {
    override def setPermission(p: Path, permission: FsPermission): Unit = {
      val bits = permission.toShort & 0x1ff // rwxrwxrwx; the tests set no sticky bit
      val modes = java.util.EnumSet.noneOf(classOf[PosixFilePermission])
      // PosixFilePermission lists OWNER_READ first and OTHERS_EXECUTE last: bit 8 down to bit 0.
      PosixFilePermission.values.foreach(m => if ((bits & (1 << (8 - m.ordinal))) != 0) modes.add(m))
      java.nio.file.Files.setPosixFilePermissions(pathToFile(p).toPath, modes)
    }

    override def getFileLinkStatus(f: Path): FileStatus =
      if (java.nio.file.Files.isSymbolicLink(pathToFile(f).toPath)) super.getFileLinkStatus(f) else getFileStatus(f)
  }
}
