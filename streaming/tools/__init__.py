"""What people run: the ``spark-abs`` command line (``cli``, with ``run``
and ``checkpoints`` in ``commands``), the money-in-transit demo (``demo``,
its operators in ``money``), aligned-vs-unaligned comparisons (``compare``)
and the smoke pipeline (``smoke``)."""
