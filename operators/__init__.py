"""Operators users write stages with: stateless transforms over Arrow batches
and keyed state that hands everything to ``snapshot()`` and takes it back in
``restore()``.  The operators arrive with the engine; this package holds their
place in the distribution."""

__all__: list[str] = []
