"""Profiles of the hot path: py-spy samples each worker process of a run
(``py-spy record --pid``, raw collapsed stacks), and the summary keeps the
functions where the samples land, by own time and by time including callees."""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["Sampler", "summarise"]


class Sampler:
    """py-spy on the given processes until ``stop``; raw stacks in ``out_dir``."""

    def __init__(self, pids: dict[str, int], out_dir: Path, rate: int = 50):
        self.files = {name: out_dir / f"{name}.stacks" for name in pids}
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        out_dir.mkdir(parents=True, exist_ok=True)
        self._processes = [
            subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(pid),
                    "--format",
                    "raw",
                    "--rate",
                    str(rate),
                    "--nonblocking",
                    "--output",
                    str(self.files[name]),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for name, pid in pids.items()
        ]

    def stop(self) -> dict[str, Path]:
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in self._processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        return {name: path for name, path in self.files.items() if path.exists()}


def summarise(stacks: Path, top: int = 25) -> str:
    """The functions with the most samples: own (the frame running) and
    inclusive (anywhere on the stack), as a text table."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in stacks.read_text(errors="replace").splitlines():
        frames, _, count = line.rpartition(" ")
        if not frames or not count.isdigit():
            continue
        n = int(count)
        total += n
        names = frames.split(";")
        own[names[-1]] += n
        for name in set(names):
            inclusive[name] += n
    if not total:
        return f"{stacks.name}: no samples\n"
    lines = [f"{stacks.name}: {total} samples", "", "own %   function"]
    lines += [f"{100 * n / total:5.1f}   {name}" for name, n in own.most_common(top)]
    lines += ["", "incl %  function (spark-abs and operators only)"]
    ours = [(name, n) for name, n in inclusive.most_common() if any(p in name for p in ("streaming/", "operators/"))]
    lines += [f"{100 * n / total:5.1f}   {name}" for name, n in ours[:top]]
    return "\n".join(lines) + "\n"
