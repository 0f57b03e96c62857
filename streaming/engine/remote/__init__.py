"""Worker groups on other hosts (docs/operations/cluster.md): who runs which
group in which generation, decided on the job's control topic alone.

- ``membership``: the bookkeeping both sides share (members, heartbeats, actions);
- ``leases``: the runner's side, its lease and what it reads of heartbeats;
- ``member``: ``RemoteWorker``, the worker's side (``spark-abs worker``)."""
