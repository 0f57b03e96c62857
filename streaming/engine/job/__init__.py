"""A job, on the runner's side: the loop that starts, steps and closes it.

- ``runner``: ``JobRunner``, topics, worker groups, restores and supervision;
- ``coordinator``: the coordinator service (triggers, acks, manifests, aborts);
- ``supervisor``: the runner's worker processes, started, watched and stopped;
- ``liveness``: when a job that runs is not live (failed checkpoints, silent workers);
- ``checkpoint_failures``: checkpoint-failure tolerance, the failed checkpoints counted;
- ``groups``: which worker group runs which tasks, and which groups run remotely;
- ``preparation``: a job's topics created, and its fresh start checked and recorded;
- ``rollback``: what going back past completed checkpoints means for Kafka sinks, said;
- ``endpoints``: the runner's metrics endpoint and the targets file of every endpoint;
- ``operations``: driving a running job from outside its loop."""
