"""Looking inside a job's checkpoints and keeping its store tidy
(``spark-abs checkpoints``, ``state``, ``restore --dry-run``).

- ``inspection``: ``Checkpoints``, the Python API behind those commands;
- ``listing``: the checkpoints of a job, a row each;
- ``detail``: one checkpoint, task by task;
- ``state``: the operator state a checkpoint holds, and diffs between two;
- ``channels``: the in-flight records a checkpoint holds or points at;
- ``plans``: what a restore would do, and whether Kafka still holds it;
- ``gc``: what may be deleted from the store, and deleting it."""
