"""What people run.

- ``cli``: the ``spark-abs`` command line, a module per command (its options, and what it runs).

A command whose work is more than its options has a package of its name:

- ``demo``: the money-in-transit demo (its pipeline is the one named ``money``, ``spark_abs_examples.money``);
- ``smoke``: the smoke pipeline;
- ``checkpoints``: looking inside a job's checkpoints (``checkpoints``, ``state``, ``restore``), and ``gc``;
- ``drill``: restore drills;
- ``compare``: aligned-vs-unaligned comparisons;
- ``ui``: a read-only web page for a job.

And what several of them draw with:

- ``tables`` and ``views``: the checkpoint tools' results as tables, and drawn with rich; the reports' table
  helpers."""
