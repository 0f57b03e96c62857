"""The engine's tests share ``task_cases`` (tasks on recorded I/O): this
conftest puts its directory on ``sys.path`` for every test below it."""
