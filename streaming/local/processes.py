"""Background services of the local runtime: start one detached with its output
in a log file and its pid in a pid file, find it again later, wait for it to be
ready, stop it.

A pid alone is never trusted: a service counts as ours only while
``/proc/<pid>/cmdline`` still contains the marker it was started with, so
``down`` cannot signal a process that merely reused the number.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from streaming.errors import PortInUseError, ServiceStartError
from streaming.waits import WaitTimeout, poll_until

__all__ = [
    "ServiceSpec",
    "free_port",
    "port_is_free",
    "ensure_port_free",
    "port_open",
    "running_pid",
    "start",
    "stop",
    "kill",
    "tail",
    "wait_ready",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """How to start one service and recognise it afterwards."""

    name: str
    argv: Sequence[str]
    log_path: Path
    pid_path: Path
    # A string that only this service's command line contains (its data dir, say).
    marker: str
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def ensure_port_free(port: int, what: str) -> None:
    if not port_is_free(port):
        raise PortInUseError(
            f"port {port} on 127.0.0.1 is in use, so {what} cannot listen there; "
            "stop whatever holds it (`ss -ltnp 'sport = :%d'` shows it) or choose another port" % port
        )


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def running_pid(pid_path: Path, marker: str) -> int | None:
    """The pid in ``pid_path`` if that process is alive and is still the service
    (its command line contains ``marker``), else None."""
    try:
        pid = int(pid_path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if marker in _cmdline(pid) else None


def start(spec: ServiceSpec) -> subprocess.Popen:
    """Start the service detached (own session), output appended to its log."""
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    spec.pid_path.parent.mkdir(parents=True, exist_ok=True)
    with open(spec.log_path, "ab") as out:
        out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {spec.name}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            list(spec.argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spec.env},
            cwd=spec.cwd,
            start_new_session=True,
        )
    spec.pid_path.write_text(f"{proc.pid}\n")
    log.debug("started %s (pid %d), log %s", spec.name, proc.pid, spec.log_path)
    return proc


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.rstrip().splitlines()[-lines:])


def wait_ready(
    spec: ServiceSpec,
    proc: subprocess.Popen,
    ready: Callable[[], bool],
    timeout_s: float,
    extra_logs: Sequence[Path] = (),
) -> float:
    """Poll ``ready`` until it holds; fail with the log tail if the process exits
    or ``timeout_s`` passes.  Returns the seconds it took."""
    started = time.monotonic()
    last_error = "not ready"

    def is_ready() -> bool:
        nonlocal last_error
        code = proc.poll()
        if code is not None:
            raise ServiceStartError(
                f"{spec.name} exited with code {code} while starting; last lines of its log "
                f"{spec.log_path}:\n{_logs(spec, extra_logs)}"
            )
        try:
            return bool(ready())
        except Exception as exc:  # a probe that fails is "not ready yet"
            last_error = f"{type(exc).__name__}: {exc}"
            log.debug("%s not ready yet: %s", spec.name, last_error)
            return False

    try:
        poll_until(is_ready, timeout_s, f"{spec.name} ready", every_s=0.25)
    except WaitTimeout:
        _terminate(proc.pid)
        raise ServiceStartError(
            f"{spec.name} did not become ready within {timeout_s:.0f} s and was stopped "
            f"(last readiness probe: {last_error}); last lines of its log {spec.log_path}:\n{_logs(spec, extra_logs)}"
        ) from None
    return time.monotonic() - started


def _logs(spec: ServiceSpec, extra: Sequence[Path]) -> str:
    parts = [tail(spec.log_path)]
    parts += [f"--- {p}:\n{tail(p)}" for p in extra if p.exists()]
    return "\n".join(parts)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _terminate(pid: int, grace_s: float = 15.0, first: signal.Signals = signal.SIGTERM) -> None:
    for sig, wait in ((first, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return

        def gone() -> bool:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            return not _alive(pid)

        try:
            poll_until(gone, wait, f"process {pid} ending after {sig.name}", every_s=0.1)
        except WaitTimeout:
            continue  # the next signal
        return


def kill(pid_path: Path, marker: str) -> int | None:
    """SIGKILL the service recorded in ``pid_path`` (a crash, for drills and
    tests) and remove the pid file.  Returns the pid, or None when it was not running."""
    pid = running_pid(pid_path, marker)
    if pid is not None:
        _terminate(pid, grace_s=0.0, first=signal.SIGKILL)
    pid_path.unlink(missing_ok=True)
    return pid


def stop(pid_path: Path, marker: str, grace_s: float = 15.0) -> int | None:
    """Stop the service recorded in ``pid_path`` (SIGTERM, then SIGKILL after
    ``grace_s``) and remove the pid file.  Returns the pid stopped, or None
    when it was not running."""
    pid = running_pid(pid_path, marker)
    if pid is not None:
        _terminate(pid, grace_s)
    pid_path.unlink(missing_ok=True)
    return pid
