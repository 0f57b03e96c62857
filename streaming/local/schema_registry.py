"""The local schema registry: Apicurio Registry, whose Confluent-compatible
API (``/apis/ccompat/v7``) serves Avro schemas by id to the jobs' ingress
and Kafka sinks (``streaming.adapters.serde.schema_registry``).

Apicurio was chosen as the registry Maven Central serves (Confluent's own and
Karapace are on none of the registries this runtime installs from).  It
listens on loopback only and keeps its schemas in an H2 database file under the
runtime directory (an id stays the same schema across restarts: records in
Kafka name it).

It answers only the runtime's user (``sparkabs``, HTTP basic; its password
generated on first start into ``<runtime>/secrets/registry.password``, 600,
given to the JVM in its environment and named in the connection file) and
only a ``Host`` of a loopback name (a filter compiled into the build,
``HOST_CHECK``): another user of the machine gets a 401, a page rebinding
its name to 127.0.0.1 a 400.  Its health checks stay open (readiness).  A
registry started without them (an earlier build) is started again.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from xml.sax.saxutils import escape

from streaming.adapters.spark.jars import COMPLETE, MAVEN_CENTRAL, maven_errors, maven_settings, require_tool
from streaming.api.config import ENV
from streaming.api.job_key import kept_secret
from streaming.errors import ArtifactResolutionError
from streaming.local import processes
from streaming.local.processes import ServiceSpec
from streaming.local.services import Progress, RuntimeServices
from streaming.private_files import replace_into

__all__ = [
    "USER",
    "RegistryStarter",
    "api_url",
    "build",
    "built",
    "data_dir_of",
    "password",
    "password_file",
    "ready",
    "server_spec",
]

log = logging.getLogger(__name__)

API_PATH = "/apis/ccompat/v7"


def password_file(runtime_dir: Path) -> Path:
    """The file of the registry user's password (made by ``password``)."""
    return runtime_dir / "secrets" / "registry.password"


def password(runtime_dir: Path) -> str:
    """The registry user's password: generated on first use, its owner's alone, then kept."""
    return kept_secret(password_file(runtime_dir), "the schema registry's password file")


def server_spec(
    services: RuntimeServices, java: str = "java", runner: Path | None = None, port: int = 0
) -> ServiceSpec:
    """The registry of the runtime ``services`` (``java``, ``runner`` and ``port`` as ``up`` starts
    it; the defaults find it)."""
    runtime_dir = services.dir
    runner = runner or Path("registry-runner.jar")
    data_dir = data_dir_of(runtime_dir)
    return ServiceSpec(
        name="registry",
        argv=[
            java,
            "-Xmx256m",
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={port}",
            f"-Dquarkus.datasource.jdbc.url=jdbc:h2:file:{data_dir}/registry;DB_CLOSE_ON_EXIT=FALSE",
            "-jar",
            str(runner),
        ],
        log_path=runtime_dir / "logs" / "registry.out",
        pid_path=runtime_dir / "pids" / "registry.pid",
        marker=str(data_dir),
        env={PASSWORD_ENV: password(runtime_dir)} if port else {},
    )


def data_dir_of(runtime_dir: Path) -> Path:
    """Where the registry keeps its schemas (made when it starts)."""
    return runtime_dir / "registry" / "data"


def api_url(port: int) -> str:
    """The Confluent-compatible API of the registry on ``port``."""
    return f"http://127.0.0.1:{port}{API_PATH}"


def ready(port: int) -> bool:
    """Whether the registry on ``port`` says it is ready."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# Apicurio Registry's Maven artifact is its application before Quarkus' build step: a
# project of one dependency builds it into a runnable jar.  For 2.4.2.Final: everit's JSON
# Schema validator comes from JitPack in its POM (Maven Central has the same packages as
# com.github.erosb's), the config-index deployment module is served at 0.1.10.Final, and
# the application jar has no Jandex index, so Quarkus is told to index it.
_REGISTRY_QUARKUS = {"2.4.2.Final": "2.16.4.Final"}
_REGISTRY_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>spark-abs.local</groupId><artifactId>schema-registry</artifactId><version>1</version>
  <properties><maven.compiler.release>17</maven.compiler.release><maven.compiler.source>17</maven.compiler.source><maven.compiler.target>17</maven.compiler.target></properties>
  <dependencyManagement><dependencies>
    <dependency><groupId>io.apicurio</groupId><artifactId>apicurio-common-app-components-config-index</artifactId><version>0.1.10.Final</version></dependency>
    <dependency><groupId>io.apicurio</groupId><artifactId>apicurio-common-app-components-config-index-deployment</artifactId><version>0.1.10.Final</version></dependency>
    <dependency><groupId>io.apicurio</groupId><artifactId>apicurio-registry</artifactId><version>{version}</version><type>pom</type><scope>import</scope></dependency>
  </dependencies></dependencyManagement>
  <dependencies>
    <dependency><groupId>io.apicurio</groupId><artifactId>apicurio-registry-app</artifactId><version>{version}</version>
      <exclusions><exclusion><groupId>com.github.everit-org.json-schema</groupId><artifactId>org.everit.json.schema</artifactId></exclusion></exclusions></dependency>
    <dependency><groupId>com.github.erosb</groupId><artifactId>everit-json-schema</artifactId><version>1.14.2</version></dependency>
    <dependency><groupId>io.quarkus</groupId><artifactId>quarkus-elytron-security-properties-file</artifactId><version>{quarkus}</version></dependency>
  </dependencies>
  <build><plugins><plugin><groupId>io.quarkus</groupId><artifactId>quarkus-maven-plugin</artifactId><version>{quarkus}</version>
    <executions><execution><goals><goal>build</goal></goals></execution></executions></plugin></plugins></build>
</project>
"""
_REGISTRY_INDEX = (
    "\nquarkus.index-dependency.apicurioapp.group-id=io.apicurio"
    "\nquarkus.index-dependency.apicurioapp.artifact-id=apicurio-registry-app\n"
)

# Every request but the health checks takes the runtime's user and password (HTTP basic, Quarkus'
# embedded realm; the password from the environment the runtime starts it with, never its command
# line), and every request a Host of a loopback name (HOST_CHECK): another user of the machine, or
# a web page rebinding its name to 127.0.0.1, gets a 401 or a 400.  Apicurio's own authentication
# mechanism (OIDC, off here) is left out of the build: asked for a challenge while off, it fails
# (a NullPointerException on its bearer mechanism) and the request is never answered.
USER = "sparkabs"
PASSWORD_ENV = "SPARK_ABS_REGISTRY_PASSWORD"
_REGISTRY_SECURITY = f"""
quarkus.security.users.embedded.enabled=true
quarkus.security.users.embedded.plain-text=true
quarkus.security.users.embedded.users.{USER}=${{{PASSWORD_ENV}}}
quarkus.security.users.embedded.roles.{USER}=sr-admin
quarkus.http.auth.basic=true
quarkus.arc.exclude-types=io.apicurio.common.apps.auth.authn.AppAuthenticationMechanism
quarkus.http.auth.permission.health.paths=/health,/health/*
quarkus.http.auth.permission.health.policy=permit
quarkus.http.auth.permission.registry.paths=/*
quarkus.http.auth.permission.registry.policy=authenticated
"""
HOST_CHECK = """package spark_abs.local;

import io.quarkus.vertx.http.runtime.filters.Filters;
import java.util.Locale;
import java.util.Set;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.event.Observes;

/** Answers only requests whose Host is a loopback name (as spark-abs's UI and metrics do). */
@ApplicationScoped
public class HostCheck {
    private static final Set<String> LOOPBACK = Set.of("localhost", "127.0.0.1", "[::1]");

    static String name(String host) {
        String name = host == null ? "" : host.trim().toLowerCase(Locale.ROOT);
        int colon = name.lastIndexOf(':');
        return colon > 0 && !name.endsWith("]") && name.indexOf(':') == colon ? name.substring(0, colon)
            : name.startsWith("[") && name.contains("]:") ? name.substring(0, name.indexOf("]:") + 1) : name;
    }

    void register(@Observes Filters filters) {
        filters.register(context -> {
            String host = context.request().getHeader("Host");
            if (LOOPBACK.contains(name(host))) {
                context.next();
            } else {
                context.response().setStatusCode(400).putHeader("Content-Type", "text/plain")
                    .end("Host not allowed: this registry answers loopback names only\\n");
            }
        }, 10000);
    }
}
"""


# what is built into the registry beyond Apicurio's own (the directory name changes with it, so
# a runtime built before is built again): 3, basic auth and the Host check
_BUILD = 3


def _registry_runner(version: str, cache_dir: Path) -> Path:
    return cache_dir / "bin" / f"apicurio-registry-{version}-b{_BUILD}" / "registry-runner.jar"


def built(version: str, cache_dir: Path) -> bool:
    """Whether Apicurio Registry ``version`` is built in the cache (``build`` has finished)."""
    runner = _registry_runner(version, cache_dir)
    return (runner.parent / COMPLETE).exists() and runner.exists()


def build(version: str, cache_dir: Path, progress: Progress = log.info) -> Path:
    """Apicurio Registry ``version``'s runnable jar (with its ``lib/`` beside
    it), built once with Maven and Quarkus from Maven Central."""
    runner = _registry_runner(version, cache_dir)
    target = runner.parent
    if built(version, cache_dir):
        return runner
    quarkus = _REGISTRY_QUARKUS.get(version)
    if quarkus is None:
        raise ArtifactResolutionError(
            f"schema registry {version}: only {', '.join(_REGISTRY_QUARKUS)} is known to build here "
            "(schema_registry_version)"
        )
    mvn = require_tool("mvn")
    repo = os.environ.get(ENV["maven_repo"]) or MAVEN_CENTRAL
    progress(f"building the schema registry Apicurio {version} with Maven (first time only, about a minute)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".registry-") as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(_REGISTRY_POM.format(version=escape(version), quarkus=escape(quarkus)))
        (work / "settings.xml").write_text(maven_settings(repo))
        base = [mvn, "-B", "-q", "-s", str(work / "settings.xml"), "-f", str(work / "pom.xml")]
        app = f"io.apicurio:apicurio-registry-app:{version}"
        _maven(base + ["dependency:copy", f"-Dartifact={app}", f"-DoutputDirectory={work / 'app'}"], app)
        resources = work / "src" / "main" / "resources"
        (resources / "META-INF").mkdir(parents=True)
        with zipfile.ZipFile(work / "app" / f"apicurio-registry-app-{version}.jar") as jar:
            for name in ("application.properties", "META-INF/web.xml", "META-INF/openapi.json"):
                (resources / name).write_bytes(jar.read(name))
        with open(resources / "application.properties", "a") as properties:
            properties.write(_REGISTRY_INDEX + _REGISTRY_SECURITY)
        sources = work / "src" / "main" / "java" / "spark_abs" / "local"
        sources.mkdir(parents=True)
        (sources / "HostCheck.java").write_text(HOST_CHECK)
        _maven(base + ["package"], f"the registry application {version}")
        output = work / "target"
        target.mkdir(exist_ok=True)
        shutil.rmtree(target / "lib", ignore_errors=True)  # an interrupted build's (moved into, it would nest)
        shutil.move(str(output / "lib"), target / "lib")
        replace_into(output / "schema-registry-1-runner.jar", runner)
        (target / COMPLETE).write_text(version + "\n")
    return runner


def _maven(cmd: list[str], what: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired as exc:
        raise ArtifactResolutionError(f"mvn took over 20 minutes on {what}; is the Maven registry reachable?") from exc
    if done.returncode != 0:
        raise ArtifactResolutionError(
            f"mvn failed on {what} (exit {done.returncode}):\n{maven_errors(done.stdout + done.stderr)}"
        )


def _open_to_anyone(port: int) -> bool:
    """Whether the registry on ``port`` lists its subjects to a request without credentials."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{API_PATH}/subjects", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class RegistryStarter:
    """The schema registry (Apicurio): kept with its port when it runs, else
    started on the configured or a free port; ready once its health check
    says so.  Only ``up`` starts it; ``running`` finds one that runs."""

    def __init__(self, services: RuntimeServices, progress: Progress):
        self.services = services
        self._progress = progress

    def running(self, remembered: dict[str, int]) -> int | None:
        """The port of the registry when it runs on the port on record, else None.  One that
        answers without credentials (an earlier build) is stopped: ``up`` starts this build."""
        probe = server_spec(self.services)
        if processes.running_pid(probe.pid_path, probe.marker) is not None and "registry" in remembered:
            port = remembered["registry"]
            if not _open_to_anyone(port):
                return port
            self._progress("stopping a schema registry that answered without credentials (an earlier build)")
            processes.stop(probe.pid_path, probe.marker)
        return None

    def up(self, java: str, runner: Path, remembered: dict[str, int], taken: set[int]) -> int:
        settings = self.services.settings
        kept = self.running(remembered)
        if kept is not None:
            return kept
        port = self.services.choose_port("registry", settings.registry_port, remembered, taken, "the schema registry")
        spec = server_spec(self.services, java, runner, port)
        data_dir_of(self.services.dir).mkdir(parents=True, exist_ok=True)
        self._progress(f"starting the schema registry Apicurio {settings.schema_registry_version} on 127.0.0.1:{port}")
        proc = processes.start(spec)
        took = processes.wait_ready(spec, proc, lambda: ready(port), settings.start_timeout_s)
        self._progress(f"schema registry ready after {took:.1f} s")
        return port
