"""One stage task (docs/architecture.md, "A task"): what happens to a
micro-batch from the moment its records reach Python to the acknowledgement
of a checkpoint.

- ``stage_task``: ``StageTask``, the barrier handler driven by micro-batches;
- ``processing``: the data path (records decoded, traced, run through the operator) and event time;
- ``gate``: the input gate, segments queued per channel and held while aligning;
- ``segments``: a micro-batch cut into runs of data and single control records;
- ``inbox``: the control events a task takes (aborts, announced barriers);
- ``controller``: what the task does at barrier n (the handler's ``Controller``);
- ``uploads``: the asynchronous phase of a snapshot;
- ``replay``: copied channel state replayed after a restore;
- ``output``: where a task's output goes (partitions or the sink's epoch);
- ``quarantine``: records a task cannot take, sent to the dead letters;
- ``record_errors``: what records the stage's code raises on do (the policy and its brake);
- ``watermarks``: the task's event-time watermark."""
