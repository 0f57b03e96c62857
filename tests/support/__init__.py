"""The test suite's own fixtures, importable by the tests (``tests/`` is on
``sys.path``) and by the processes they start (``tests/conftest.py`` puts it
on their ``PYTHONPATH``):

- ``pipelines``: pipelines only the tests run (a broken Spark stage);
- ``jobs``: a money job whose checkpoints are counted, a remote worker process;
- ``checkpoints``: a checkpoint written into a store by hand."""
