"""spark-abs's own classes for Spark's JVM (``streaming/adapters/spark/java/*.java``),
compiled once per source and Spark version into a jar in the cache, which
every Spark session of the engine loads (``streaming.adapters.spark.session``).

What they do is what Spark's DataFrame API cannot do in one pass over a
micro-batch: ``spark_abs.Runs`` numbers the runs of records between control
records (``streaming.adapters.spark.stage``).  The jar is built with the
JDK's ``javac`` against the jars of the installed pyspark, into a name that
carries a digest of the sources and the Spark version: a changed source or
another Spark gets a jar of its own, and an interrupted build leaves no jar
behind (it is renamed into place last)."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from streaming.adapters.spark.jars import require_tool
from streaming.errors import ArtifactResolutionError
from streaming.private_files import replace_into

__all__ = ["SOURCES", "helper_jar", "compile_jar"]

log = logging.getLogger(__name__)

SOURCES = Path(__file__).parent / "java"
_JAVAC_BOUND_S = 300


def _digest(sources: list[Path], name: str) -> str:
    digest = hashlib.sha256(name.encode())
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def helper_jar(
    spark_version: str, cache_dir: Path, spark_jars_dir: Path, progress: Callable[[str], None] = log.info
) -> Path:
    """The jar of spark-abs's JVM classes for ``spark_version``, built on
    first use with ``javac`` against ``spark_jars_dir``."""
    return compile_jar(
        SOURCES,
        [spark_jars_dir / "*"],
        f"spark-abs-jvm-{spark_version}",
        cache_dir,
        what=f"spark-abs's Spark classes for Spark {spark_version}",
        hint=f"is pyspark {spark_version} installed whole?",
        progress=progress,
    )


def compile_jar(
    sources_dir: Path,
    classpath: list[Path],
    name: str,
    cache_dir: Path,
    *,
    what: str,
    hint: str,
    progress: Callable[[str], None] = log.info,
) -> Path:
    """The Java sources of ``sources_dir`` compiled against ``classpath`` into
    ``cache_dir/jars/<name>-<digest>.jar`` (``what`` they are, for the
    messages; ``hint``: what to check when javac fails), once per source."""
    sources = sorted(sources_dir.glob("*.java"))
    if not sources:
        raise ArtifactResolutionError(f"no Java sources in {sources_dir}: the package is installed without them")
    target = cache_dir / "jars" / f"{name}-{_digest(sources, name)}.jar"
    if target.exists():
        return target
    javac = require_tool("javac")
    progress(f"compiling {what} ({', '.join(s.name for s in sources)})")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        classes = Path(tmp) / "classes"
        cmd = [
            javac,
            "--release",
            "17",
            "-nowarn",
            "-cp",
            os.pathsep.join(map(str, classpath)),
            "-d",
            str(classes),
            *map(str, sources),
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=_JAVAC_BOUND_S)
        except subprocess.TimeoutExpired as exc:
            raise ArtifactResolutionError(f"javac took over {_JAVAC_BOUND_S} s compiling {what}") from exc
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip()[-2000:]
            raise ArtifactResolutionError(
                f"javac could not compile {what} against {os.pathsep.join(map(str, classpath))} "
                f"(exit {done.returncode}); {hint}\n{said}"
            )
        built = Path(tmp) / target.name
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: spark-abs\n\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
        replace_into(built, target)
    return target
