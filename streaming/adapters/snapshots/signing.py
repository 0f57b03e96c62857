"""The store's job files signed with the job's store key
(``JobKey.store``): ``_JOB.json``, each checkpoint's manifest and each
task's ``_TASK.json``.  Whoever can write the store but does not hold the
key cannot make a restore read a file it wrote or edited: a manifest or
``_TASK.json`` that does not verify makes its checkpoint corrupt (a restore
falls back past it), a ``_JOB.json`` that does not verify stops the job
with the reason.

A signed file is the JSON object itself with a first member ``"mac"``: the
HMAC-SHA256, under the store key, of the job's name, the store's place
(``file://<dir>`` or ``s3://<bucket>/<prefix>``, as ``open_store`` makes it
canonical: a checkpoint copied from another store, staging's say, does not
verify), the file's place in it
(``job``, ``manifest <id>``, ``task <id> <task>``: a file copied to another
place does not verify there) and the exact bytes of the object without that
member, each length-prefixed.  Any JSON reader still reads the file; the
member is always ``{"mac": "<64 hex digits>", `` at the start, so the bytes
it covers are recovered exactly, without parsing."""

from __future__ import annotations

import re

from barriers.messages import UNSIGNED, Unsigned
from streaming.api.job_key import JobKey
from streaming.errors import SnapshotCorruptError

__all__ = ["UNSIGNED", "StoreSigner", "Unsigned"]

_PREFIX = b'{"mac": "'
_SIGNED = re.compile(rb'\{"mac": "([0-9a-f]{64})", ')


class StoreSigner:
    """Signs and verifies job ``job``'s files in the store at ``store`` with ``key``
    (``UNSIGNED``: a store read and written without signatures, said explicitly: every
    runner and worker passes the job's store key)."""

    def __init__(self, job: str, key: bytes | Unsigned, store: str):
        if key is not UNSIGNED and not isinstance(key, bytes):
            raise TypeError("a store's key is the job's store key (bytes), or UNSIGNED said explicitly")
        self.job = job
        self.store = store
        # JobKey's signature is the length-prefixed HMAC-SHA256 this format needs
        self.key = None if isinstance(key, Unsigned) else JobKey(job, key)

    def sign(self, body: bytes, *place: str) -> bytes:
        """``body`` (a JSON object's bytes) as a signed file of ``place``."""
        if self.key is None:
            return body
        if not body.startswith(b"{") or body[1:].lstrip().startswith(b"}"):
            raise ValueError("only a non-empty JSON object is signed")
        mac = self.key.sign(self.job.encode(), self.store.encode(), " ".join(place).encode(), body)
        return _PREFIX + mac.encode() + b'", ' + body[1:]

    def body(self, data: bytes, what: str, *place: str) -> bytes:
        """The bytes ``data`` signs, once verified; a ``SnapshotCorruptError``
        naming ``what`` and why when they are not signed with the job's key."""
        if self.key is None:
            return data
        matched = _SIGNED.match(data)
        if matched is None:
            raise SnapshotCorruptError(
                f"{what} is not signed with job {self.job}'s key (written by someone else, or by a version "
                "that did not sign the store's files)"
            )
        body = b"{" + data[matched.end() :]
        if not self.key.verify(
            matched.group(1), self.job.encode(), self.store.encode(), " ".join(place).encode(), body
        ):
            raise SnapshotCorruptError(
                f"{what}: its signature does not match job {self.job}'s key (edited, or copied from another place "
                "or another store)"
            )
        return body
