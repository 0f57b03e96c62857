"""What people run:

- ``cli``: the ``spark-abs`` command line, a module per command;
- ``commands``: a job run from the command line until it should stop;
- ``demo``: the money-in-transit demo (its pipeline is the one named ``money``, ``spark_abs_examples.money``);
- ``checkpoints``: looking inside a job's checkpoints, and ``gc``;
- ``drill``: restore drills;
- ``compare``: aligned-vs-unaligned comparisons;
- ``ui``: a read-only web page for a job;
- ``tables`` and ``views``: the checkpoint tools' results as tables, and drawn with rich;
- ``smoke``: the smoke pipeline."""
