"""Record formats, read and written:

- ``records``: the shapes of Kafka records as Arrow (a micro-batch's
  columns, header values);
- ``codec``: ingress values (JSON, Avro) decoded into Arrow rows, and the
  Arrow batches of stage-to-stage topics encoded and decoded;
- ``arrow_ipc``: Arrow IPC read within a cap on its decompressed bytes;
- ``avro``: Avro values, by the ingress schema or a registered writer's;
- ``schema_registry``: a schema registry's client (Avro schemas by id).

The Avro schemas a pipeline declares are ``streaming.api.avro_schema``'s."""
