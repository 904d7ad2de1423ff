// heapstate: a heap StateStoreProvider for Spark Structured Streaming.
//
// Spark 4.3.0 is `Provided`. Maven Central does not carry Spark 4.3.0's jars, but the pyspark 4.3.0
// package on PyPI ships exactly those jars, so the build compiles against the jars of the
// `.venv-spark43` venv that bin/setup creates (override with SPARK_JARS_DIR).
import java.io.File

ThisBuild / scalaVersion := "2.13.18"
ThisBuild / organization := "io.heapstate"
ThisBuild / version := "0.1.0"

lazy val sparkJarsDir = settingKey[File]("Directory holding the Spark 4.3.0 jars (Provided)")

lazy val root = (project in file("."))
  .settings(
    name := "heapstate",
    sparkJarsDir := {
      sys.env.get("SPARK_JARS_DIR").map(file).getOrElse {
        val lib = baseDirectory.value / ".venv-spark43" / "lib"
        val found =
          Option(lib.listFiles).toSeq.flatten.map(_ / "site-packages" / "pyspark" / "jars").find(_.isDirectory)
        found.getOrElse(sys.error(s"Spark 4.3.0 jars not found under $lib; run bin/setup first"))
      }
    },
    Compile / scalaSource := baseDirectory.value / "scala" / "src" / "main" / "scala",
    Compile / javaSource := baseDirectory.value / "scala" / "src" / "main" / "java",
    Compile / resourceDirectory := baseDirectory.value / "scala" / "src" / "main" / "resources",
    Test / scalaSource := baseDirectory.value / "tests" / "scala",
    Test / resourceDirectory := baseDirectory.value / "tests" / "scala-resources",
    Compile / unmanagedJars ++= (sparkJarsDir.value ** "*.jar").classpath,
    libraryDependencies += "org.scalatest" %% "scalatest" % "3.2.19" % Test,
    compileOrder := CompileOrder.JavaThenScala,
    javacOptions ++= Seq("--release", "17"),
    // `-Ydelambdafy:inline`: a lambda is a class in the jar, not one the JVM spins (with the JDK's
    // ASM, interpreted at first) when its call site first runs. A restart's first batch runs some
    // 43 of heapstate's lambda sites for the first time; RestartLoad's cold batch went from a
    // median of 461 to 428 ms over 34 fresh JVMs each (stop 70).
    scalacOptions ++= Seq("-release", "17", "-deprecation", "-feature", "-unchecked", "-Ydelambdafy:inline"),
    Compile / packageBin / artifactPath := target.value / "heapstate.jar",
    Test / fork := true,
    Test / parallelExecution := false,
    Test / javaOptions ++= Seq(
      "-Xmx3g",
      "--add-opens=java.base/java.lang=ALL-UNNAMED",
      "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED",
      "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
      "--add-opens=java.base/java.io=ALL-UNNAMED",
      "--add-opens=java.base/java.net=ALL-UNNAMED",
      "--add-opens=java.base/java.nio=ALL-UNNAMED",
      "--add-opens=java.base/java.util=ALL-UNNAMED",
      "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
      "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
      "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
      "--add-opens=java.base/sun.nio.cs=ALL-UNNAMED",
      "--add-opens=java.base/sun.security.action=ALL-UNNAMED",
      "--add-opens=java.base/sun.util.calendar=ALL-UNNAMED",
      "-Djdk.reflect.useDirectMethodHandle=false"
    ),
    Test / testOptions += Tests.Argument(TestFrameworks.ScalaTest, "-oD")
  )

// `run` in a JVM of its own, from the checkout's root, its output straight to the console: the
// bench and fmt projects' tools.
lazy val forkedRunFromRoot = Seq(
  run / fork := true,
  run / connectInput := false,
  run / baseDirectory := (root / baseDirectory).value,
  run / outputStrategy := Some(StdoutOutput)
)

// Benchmarks that drive StateStore directly (W3). Not part of `bin/sbt test`; run with
// `bin/sbt "bench/run --size small"` or bench/w3.sh.
lazy val bench = (project in file("bench"))
  .dependsOn(root)
  .settings(
    name := "heapstate-bench",
    Compile / scalaSource := baseDirectory.value / "scala",
    // `bench/run` is W3; other benchmarks (W2) run with `bench/runMain <class>`.
    Compile / run / mainClass := Some("heapstate.bench.W3StoreOps"),
    Compile / resourceDirectory := baseDirectory.value / "resources",
    Compile / unmanagedJars ++= (root / sparkJarsDir).map(d => (d ** "*.jar").classpath).value,
    forkedRunFromRoot,
    run / javaOptions ++= Seq("-Xms6g", "-Xmx6g"),
    run / javaOptions ++= (root / Test / javaOptions).value.filter(_.startsWith("--add-opens"))
  )

// scalafmt, run from Maven Central's scalafmt-cli with the checked-in .scalafmt.conf: bin/test runs
// `bin/sbt "fmt/run --test"` (fails on any file not formatted), `bin/sbt "fmt/run"` formats in place.
lazy val fmt = (project in file("target/fmt"))
  .settings(
    name := "heapstate-fmt",
    libraryDependencies += "org.scalameta" %% "scalafmt-cli" % "3.7.17",
    Compile / run / mainClass := Some("org.scalafmt.cli.Cli"),
    forkedRunFromRoot
  )
