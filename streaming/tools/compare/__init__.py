"""What aligned and unaligned checkpoints cost, side by side (``spark-abs compare``).

- ``run``: the jobs of a comparison, run at the same time on the same records;
- ``workloads``: what the jobs run and the variants compared;
- ``model``: what was measured;
- ``report``: the comparison's tables and charts;
- ``slow``: the pipeline its workloads run, a deliberately slow stage."""
