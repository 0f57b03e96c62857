"""A restore drill's failures, injected (``streaming.tools.drill.run``): one
method per failure kind (a worker killed at random or at a fault point, the
runner killed, a checkpoint damaged, a service down, records deleted under
the job, a worker frozen, a task stuck in a send, records no schema
expected on the ingress topics; the local cluster's kinds
in ``streaming.tools.drill.cluster``),
then the wait for the job to recover from it: a checkpoint completes after
it (for a kind that must restore, in a later generation), which is timed,
with the checkpoint each restore it caused started from and the input
records it read again, and for the kinds that must restore or must not,
whether it did (``restore_problem``)."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Mapping
from datetime import datetime

from barriers.messages import ChannelId
from streaming.adapters.kafka.admin import delete_records, earliest_offsets
from streaming.adapters.snapshots import Manifest
from streaming.api.pipeline import Pipeline
from streaming.engine import faults
from streaming.engine.kafka_retention import needs
from streaming.errors import ConfigError
from streaming.tools.drill.cluster import ClusterFailures
from streaming.tools.drill.feed import ProgressWatch
from streaming.tools.drill.job import DrilledJob, is_running, job_worker_pids, kill_group, processes_left
from streaming.tools.drill.plan import (
    CLUSTER_ONLY,
    ORPHAN_BOUND_S,
    Failure,
    FailureKind,
    FailureOutcome,
    must_restore,
    restore_problem,
)
from streaming.tools.drill.poison import HOSTILE, hostile_records, own_poison
from streaming.tools.drill.workload import DrillWorkload, InputRecord

__all__ = ["FailureInjector", "retention_cut"]


class FailureInjector:
    """Injects each failure of a drill into ``job`` and waits for the job to
    recover from it; what goes wrong outside the expectations (a failure not
    recovered, an orphan, a damaged checkpoint restored) goes to ``problems``."""

    def __init__(
        self,
        job: DrilledJob,
        watch: ProgressWatch,
        *,
        runtime,
        wait: Callable[[Callable[[], bool], float], bool],  # until the condition holds or the timeout passed
        log: Callable[[str], None],
        problems: list[str],
        started: float,
        recover_timeout_s: float,
        pipeline: Pipeline | None = None,
        workload: DrillWorkload | None = None,
        last_sent: Callable[[], Mapping[str, InputRecord]] = dict,
    ):
        self.job = job
        self.watch = watch
        self.runtime = runtime
        self.wait = wait
        self.log = log
        self.problems = problems
        self.started = started
        self.recover_timeout_s = recover_timeout_s
        # the poison kind: the pipeline's ingress, the workload's own records its code raises on, made
        # from the last it sent
        self.pipeline = pipeline
        self.workload = workload
        self.last_sent = last_sent
        self.poisoned: list[tuple[str, int]] = []  # (channel, offset) of the poison records sent
        self.cluster = ClusterFailures(self)

    def inject(self, failure: Failure, rng: random.Random) -> FailureOutcome:
        """Inject ``failure``, wait for the recovery and say what happened."""
        outcome = FailureOutcome(failure, round(time.monotonic() - self.started, 1))
        newest_before = max(self.job.completed() or [0])
        generation = self.job.generation()
        t0 = time.monotonic()
        kind = failure.kind
        check: Callable[[], None] | None = None  # a cluster kind's check once the job recovered
        struck = True
        if kind in CLUSTER_ONLY:
            hit = self.cluster.strike(outcome)
            t0, newest_before, check, struck = hit.at, hit.newest, hit.check, hit.struck
            outcome.at_s = round(t0 - self.started, 1)
        elif kind is FailureKind.WORKER:
            if failure.moment == "random":
                self._kill_a_worker(rng)
            else:
                t0, newest_before = self._fault_point(outcome, rng, generation)
        elif kind is FailureKind.RETENTION:
            self._retention(outcome)
            self._kill_a_worker(rng)
        elif kind in (FailureKind.RUNNER, FailureKind.DAMAGE):
            self._kill_runner(outcome)
            if kind is FailureKind.DAMAGE:
                self._damage(outcome, rng)
            self.job.start_runner()
        elif kind is FailureKind.WORKER_FROZEN:
            struck = self._freeze(outcome, rng)
        elif kind is FailureKind.STUCK_SEND:
            self._stuck_send(outcome, generation)
        elif kind is FailureKind.POISON:
            self._poison()
        else:
            self._outage(failure)
        try:
            self._recover(outcome, t0, newest_before, generation, restores=struck and must_restore(kind) is True)
            if kind is FailureKind.STUCK_SEND:
                faults.arm(str(self.job.fault_file), [])  # the restored generation no longer matches it anyway
            if check is not None:
                check()
        finally:
            self.cluster.bring_back()  # a node the failure killed, whatever went wrong
        problem = restore_problem(outcome) if struck else None
        if problem is not None:
            self.problems.append(problem)
        self._damaged_not_restored(outcome)
        self._deleted_not_restored(outcome)
        return outcome

    # ---- the failure kinds

    def _poison(self) -> None:
        """Append records no schema expected to the ingress topics
        (``streaming.tools.drill.poison``), each noted to become a dead letter."""
        from streaming.adapters.kafka import clients as kafka_clients

        if self.pipeline is None:
            raise ConfigError("the poison kind needs the drilled pipeline (FailureInjector(pipeline=...))")
        poisoned = self.workload.poisoned if self.workload is not None else None
        hostile = hostile_records(self.pipeline)
        own = own_poison(self.pipeline, poisoned, dict(self.last_sent()))
        producer = kafka_clients.raw_producer(self.job.connection.kafka, acks="all")
        try:
            sent = [
                (r, producer.send(r.topic, value=r.value, headers=list(r.headers), partition=r.partition))
                for r in (*hostile, *own)
            ]
            producer.flush(60)
            for record, future in sent:
                self.poisoned.append((f"{record.topic}:{record.partition}", future.get(timeout=60).offset))
        finally:
            producer.close()
        self.log(
            f"  {len(hostile)} records no schema expected on the ingress topics ({', '.join(HOSTILE[:-1])}; "
            f"{HOSTILE[-1]} on an Avro ingress) and {len(own)} of the workload's own its code raises on"
        )

    def _kill_a_worker(self, rng: random.Random) -> None:
        """SIGKILL one of the job's workers (on the cluster: a member the lease names)."""
        if self.job.hosts is not None:
            self.cluster.kill_a_member(rng)
            return
        pids = self.job.worker_pids()
        if pids:
            kill_group(rng.choice(pids))

    def _fault_point(self, outcome: FailureOutcome, rng: random.Random, generation: int) -> tuple[float, int]:
        """A worker kills itself at the fault point armed in it (during a
        restore: the one the drill causes by killing a worker); recovery
        counts from there: (when, the newest checkpoint completed then)."""
        failure = outcome.failure
        target = generation + 1 if failure.moment == "during_restore" else generation
        faults.arm(str(self.job.fault_file), [f"{failure.task}:{failure.moment}:*:{target}"])
        if failure.moment == "during_restore":
            self._kill_a_worker(rng)  # the restore this causes is where the fault waits
        fired = self.wait(lambda: self.job.generation() > target, 60.0)
        faults.arm(str(self.job.fault_file), [])
        # recovery counts from the restore the fault caused
        t0 = time.monotonic()
        outcome.at_s = round(t0 - self.started, 1)
        newest_before = max(self.job.completed() or [0])
        if not fired:
            outcome.note = f"{failure.moment} did not come within 60 s; killed at a random moment instead"
            self._kill_a_worker(rng)
        return t0, newest_before

    def _kill_runner(self, outcome: FailureOutcome) -> None:
        """SIGKILL the runner; its workers and their JVMs must stop by themselves within ORPHAN_BOUND_S
        (remote members stay up: they must stop their tasks once its lease lapsed)."""
        if self.job.hosts is not None:
            self.cluster.kill_runner(outcome, lapse=True)
            return
        runner = self.job.runner
        assert runner is not None
        groups = job_worker_pids(self.job.job)  # each worker leads its process group, its JVM in it
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        killed = time.monotonic()
        left = processes_left(self.job.job, groups, ORPHAN_BOUND_S)
        if not left:
            outcome.orphans_gone_s = round(time.monotonic() - killed, 2)
            self.log(f"  no process of the job left {outcome.orphans_gone_s:.1f} s after the runner died")
            return
        self.problems.append(
            f"failure {outcome.failure.index + 1}: processes {left} of the job outlived their runner by "
            f"{ORPHAN_BOUND_S:.0f} s"
        )
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _damage(self, outcome: FailureOutcome, rng: random.Random) -> None:
        """Damage the newest complete checkpoint: delete one of its parts or flip a byte of one."""
        store = self.job.store
        done = self.job.completed()
        if not done:
            outcome.add_note("no complete checkpoint to damage")
            return
        newest = done[-1]
        manifest = store.read_manifest(newest)
        parts = sorted(p.path for snap in manifest.tasks.values() for p in snap.parts)
        if not parts:
            outcome.add_note(f"checkpoint {newest} has no parts to damage")
            return
        path = store.layout.part(newest, rng.choice(parts))
        fs = store.location.filesystem
        if outcome.failure.moment == "delete a part":
            fs.delete_file(path)
        else:
            with fs.open_input_file(path) as f:
                raw = bytearray(f.read())
            raw[len(raw) // 2] ^= 0xFF
            with fs.open_output_stream(path) as f:
                f.write(bytes(raw))
        outcome.damaged = newest
        outcome.add_note(
            f"{outcome.failure.moment} of checkpoint {newest}: {path.rsplit('/', 3)[-3]}/…/{path.rsplit('/', 1)[-1]}"
        )

    def _retention(self, outcome: FailureOutcome) -> None:
        """Delete, as retention would, every record of the job's internal
        topics before where the newest complete checkpoint reads each
        partition again (``retention_cut``): older checkpoints lose what
        they need, that one and later ones lose nothing.  Ingress topics are
        left whole (the reference is computed from them)."""
        done = self.job.completed()
        if not done:
            outcome.note = "no complete checkpoint: nothing deleted"
            return
        newest = done[-1]
        cut = retention_cut(self.job.store.read_manifest(newest), set(self.watch.ingress))
        kafka = self.job.connection.kafka
        earliest = earliest_offsets(kafka, cut)
        delete_records(kafka, cut)
        deleted = sum(max(0, offset - earliest.get(channel, 0)) for channel, offset in cut.items())
        outcome.kept_from = newest
        outcome.note = (
            f"{deleted} records of {len(cut)} internal partitions deleted, up to what checkpoint {newest} needs"
        )

    def _outage(self, failure: Failure) -> None:
        """The local runtime's Kafka broker or S3 server down for ``outage_s``, then up again."""
        service = "kafka" if failure.kind in (FailureKind.BROKER, FailureKind.BROKER_LONG) else "s3"
        self.runtime.stop_service(service)
        time.sleep(failure.outage_s)
        self.runtime.up()

    def _freeze(self, outcome: FailureOutcome, rng: random.Random) -> bool:
        """SIGSTOP a worker's process (its Spark JVM runs on) for up to
        ``outage_s``, past the heartbeat timeout: the runner must find its
        tasks silent and SIGKILL it.  A worker still there then is continued
        (SIGCONT), and the drill goes on to see whether the job restores.
        False when there was no worker to freeze."""
        pids = self.job.worker_pids()
        if not pids:
            outcome.add_note("no worker process to freeze")
            return False
        pid = rng.choice(pids)
        os.kill(pid, signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            gone = self.wait(lambda: not is_running(pid), outcome.failure.outage_s)
        finally:
            if is_running(pid):
                os.kill(pid, signal.SIGCONT)
        if gone:
            outcome.add_note(f"worker {pid} frozen, gone {time.monotonic() - frozen:.1f} s later")
        else:
            outcome.add_note(f"worker {pid} still there after {outcome.failure.outage_s:.0f} s frozen: continued")
        return True

    def _stuck_send(self, outcome: FailureOutcome, generation: int) -> None:
        """Arm ``stuck_send`` in the running worker for the task's next
        checkpoint: its thread blocks for good where it flushes its sends
        (the worker goes on publishing progress); the job must notice its
        checkpoints failing and restore."""
        task = outcome.failure.task
        faults.arm(str(self.job.fault_file), [f"{task}:stuck_send:*:{generation}"])
        outcome.add_note(f"{task} stuck at its next checkpoint (generation {generation})")

    # ---- the recovery

    def _recover(
        self, outcome: FailureOutcome, t0: float, newest_before: int, generation_before: int, *, restores: bool = False
    ) -> None:
        """Wait for a checkpoint completed after ``newest_before``; with
        ``restores`` (a kind that must restore) one a generation after
        ``generation_before`` completed: a checkpoint the killed member had
        acked may still complete before the runner notices it silent."""
        generations: dict[int, int | None] = {}  # checkpoint -> the generation that completed it

        def recovered() -> bool:
            done = self.job.completed()
            if not done or done[-1] <= newest_before:
                return False
            if not restores:
                return True
            if generations.get(done[-1]) is None:
                generations[done[-1]] = self.job.generation_of(done[-1])
            return (generations[done[-1]] or 0) > generation_before

        # a stuck send: the time the job takes to notice, then the limit
        limit_s = self.recover_timeout_s + outcome.failure.notice_s
        if self.wait(recovered, limit_s):
            outcome.recovered_s = round(time.monotonic() - t0, 2)
        since = [r for r in self.job.restores() if r.generation > generation_before]
        if outcome.recovered_s is None:
            what = f"failure {outcome.failure.index + 1} ({outcome.failure.describe()})"
            went_on = restores and not since and max(self.job.completed() or [0]) > newest_before
            self.problems.append(
                f"{what}: checkpoints completed, but the job did not restore within {limit_s:.0f} s, and it must"
                if went_on
                else f"{what}: no checkpoint completed within {limit_s:.0f} s"
            )
        outcome.restored_from = [r.from_checkpoint for r in since]
        outcome.causes = [r.cause for r in since]
        if since:
            outcome.replayed = self._replayed(since[-1].generation, since[-1].from_checkpoint)
            outcome.restore_s = _since(since[0].at, time.time() - (time.monotonic() - t0))

    def _replayed(self, generation: int, checkpoint_id: int | None) -> int | None:
        """Ingress records read again by ``generation``: how far the generations
        before it read, less where its checkpoint resumes."""
        furthest = self.watch.before(generation)
        if not furthest:
            return None
        resume: dict[str, int] = {}
        if checkpoint_id is not None:
            manifest = self.job.quietly(lambda: self.job.store.read_manifest(checkpoint_id))
            if manifest is None:
                return None
            for snapshot in manifest.tasks.values():
                for channel, position in snapshot.positions.items():
                    if channel in self.watch.ingress:
                        resume[channel] = position
        return sum(max(0, position - resume.get(channel, 0)) for channel, position in furthest.items())

    def _damaged_not_restored(self, outcome: FailureOutcome) -> None:
        """A restore after a damage must have skipped the damaged checkpoint for an older one."""
        if outcome.damaged is not None and outcome.restored_from:
            picked = outcome.restored_from[-1]
            if picked is not None and picked >= outcome.damaged:
                self.problems.append(
                    f"failure {outcome.failure.index + 1}: the restore used checkpoint {picked}, which the drill damaged"
                )

    def _deleted_not_restored(self, outcome: FailureOutcome) -> None:
        """A restore after records were deleted must have used a checkpoint Kafka still holds."""
        if outcome.kept_from is not None and outcome.restored_from:
            picked = outcome.restored_from[-1]
            if picked is None or picked < outcome.kept_from:
                self.problems.append(
                    f"failure {outcome.failure.index + 1}: the restore used "
                    f"{'the beginning' if picked is None else f'checkpoint {picked}'}, whose records the drill "
                    f"deleted (checkpoint {outcome.kept_from} and later ones kept theirs)"
                )


def retention_cut(manifest: Manifest, ingress: set[str]) -> dict[ChannelId, int]:
    """Per partition of an internal topic, the offset a restore from
    ``manifest``'s checkpoint reads it again from (its position, or where
    its channel state kept as a range starts): what retention may delete
    before it leaves that checkpoint restorable."""
    return {
        need.channel: need.offset
        for snapshot in manifest.tasks.values()
        for need in needs(snapshot)
        if str(need.channel) not in ingress
    }


def _since(at: str | None, struck: float) -> float | None:
    """Seconds from ``struck`` (epoch seconds) to ``at`` (an ISO time the
    runner wrote), or None when there is no readable time."""
    try:
        return max(0.0, round(datetime.fromisoformat(at).timestamp() - struck, 2)) if at else None
    except ValueError:
        return None
