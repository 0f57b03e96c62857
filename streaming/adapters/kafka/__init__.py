"""Kafka: every client and every byte the job reads or writes there.

- ``clients``: every client, made from a ``KafkaAccess``, and Kafka's
  refusals explained;
- ``admin``: topics, their offsets and their retention; the cluster's id, and
  the job's key bound to it (``job_key``);
- ``acls``: the ACLs one job needs, from its pipeline, granted and revoked;
- ``producer``: the producer factory, sends whose failures are raised
  (``CheckedSends``) and markers and records appended to explicit channels;
- ``ranges``: offset ranges of a channel read back in bulk;
- ``dead_letters``: the dead-letter topic's writer;
- ``transactions``: the Kafka sink's transactions, written by Kafka's Java
  client (``java/TransactionalSender.java``) in a JVM of its own;
- ``control``: the job's control topic, its events apart from their signing
  and their transport.

Topic names are ``streaming.api.topics``'s, header names ``barriers.headers``'s."""
