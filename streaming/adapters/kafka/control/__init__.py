"""The job's control topic, how the coordinator and the tasks talk:

- ``events``: the messages, one frozen dataclass per kind, encoded and
  decoded in one place;
- ``signing``: each event signed with the job's key, and verified before
  anyone acts on it;
- ``transport``: the topic itself (one partition), publishing and polling."""
