"""Restore (docs/architecture.md, "Restore"): which checkpoint a new
generation starts from and how each task starts from it, also when the
pipeline or its task counts changed since.

- ``service``: ``RestoreService``, picking and preparing the checkpoint;
- ``start``: where one task starts in the new generation;
- ``rescale``: a checkpoint written again for other task counts;
- ``changes``: a checkpoint restored into a changed pipeline."""
