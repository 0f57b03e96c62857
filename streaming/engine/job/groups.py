"""Which worker process runs which tasks of a job: its worker groups
(``"one"``, ``"per-stage"`` or a mapping, ``RunOptions.workers``), checked
to run every task exactly once, at the scale the job runs with now; and
which of them ``spark-abs worker`` processes run on other hosts
(``RunOptions.remote``), the others being the runner's own."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from streaming.api.pipeline import Pipeline, Scale
from streaming.api.settings import WORKER_GROUPINGS
from streaming.errors import ConfigError, SparkAbsError

__all__ = ["JobGroups", "worker_groups"]

Workers = Mapping[str, list[str]] | str | None


def worker_groups(pipeline: Pipeline, workers: Workers) -> dict[str, list[str]]:
    """Which worker runs which tasks: ``"one"`` (the default: one worker,
    ``all``), ``"per-stage"`` (a worker per stage, named after it) or a
    mapping of worker names to task names."""
    if workers is None or workers == "one":
        return {"all": [t.name for t in pipeline.tasks()]}
    if workers == "per-stage":
        groups: dict[str, list[str]] = {}
        for task in pipeline.tasks():
            groups.setdefault(task.stage, []).append(task.name)
        return groups
    if isinstance(workers, str):
        raise ConfigError(f"workers: {workers!r} is not one of {', '.join(WORKER_GROUPINGS)} or a mapping")
    return dict(workers)


class JobGroups:
    """The worker groups of a job whose code declares ``declared``, run at
    the scale of ``pipeline`` (``at`` another, later), as ``workers`` groups
    its tasks, ``remote`` naming the groups remote workers run (True: all)."""

    def __init__(self, declared: Pipeline, pipeline: Pipeline, workers: Workers, remote: bool | Collection[str]):
        self.declared = declared
        self.workers = workers
        self.pipeline = pipeline
        self.groups = self.of(pipeline)
        self.remote_names = set(self.groups) if remote is True else set(remote or ())
        unknown = sorted(self.remote_names - set(self.groups))
        if unknown:
            raise ConfigError(
                f"remote worker groups {', '.join(unknown)}: the job's groups are {', '.join(sorted(self.groups))}"
            )

    def of(self, pipeline: Pipeline) -> dict[str, list[str]]:
        """``pipeline``'s groups; a ``SparkAbsError`` unless they run every task exactly once."""
        groups = worker_groups(pipeline, self.workers)
        tasks = {t.name for t in pipeline.tasks()}
        grouped = [t for names in groups.values() for t in names]
        if sorted(grouped) != sorted(tasks):
            raise SparkAbsError(
                f"workers must run every task exactly once: tasks {sorted(tasks)}, workers run {sorted(grouped)}"
            )
        return groups

    def at(self, pipeline: Pipeline) -> None:
        """From now on the job runs ``pipeline`` (the declared one at some scale)."""
        self.groups = self.of(pipeline)
        self.pipeline = pipeline

    @property
    def local(self) -> dict[str, list[str]]:
        """The groups the runner starts itself."""
        return {name: tasks for name, tasks in self.groups.items() if name not in self.remote_names}

    @property
    def remote(self) -> dict[str, list[str]]:
        """The groups remote workers run."""
        return {name: tasks for name, tasks in self.groups.items() if name in self.remote_names}

    @property
    def scale(self) -> Scale | None:
        """The job's scale when other than its code declares (None: as declared)."""
        return None if self.pipeline.scale == self.declared.scale else self.pipeline.scale
