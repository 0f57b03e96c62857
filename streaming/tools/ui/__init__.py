"""``spark-abs ui``: a read-only web page for one job.

- ``app``: the Flask app and its pages;
- ``live``: what the job's control topic says now (checkpoints in progress);
- ``templates``: the pages' HTML."""
