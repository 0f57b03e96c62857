"""``spark-abs ui``: a read-only web page for one job.

- ``app``: the Flask app and its pages;
- ``access``: the Host a request may name and the token it must carry;
- ``live``: what the job's control topic says now (checkpoints in progress,
  failed in a row);
- ``liveness``: whether the job still completes checkpoints;
- ``templates``: the pages' HTML."""
