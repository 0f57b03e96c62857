"""Teaching and verification tools for the protocol: a deterministic
simulator of processes joined by FIFO channels (``simulator``), a checker
for consistent cuts and stable predicates (``checker``) and a narration of
runs in words (``narrate``, ``spark-abs simulate``).  Pure Python, like the
rest of ``barriers``."""
