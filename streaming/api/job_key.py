"""The job's key: what signs every control event, lease and barrier a job
writes, so that a reader can tell them from records anyone else who can write
to the job's Kafka topics appended (docs/operations/security.md).

The operator holds one secret: ``SPARK_ABS_JOB_SECRET``, or a file named by
``SPARK_ABS_JOB_SECRET_FILE`` that only its owner can read; the local runtime
generates one (``<home>/runtime/job.secret``) and lists it in its connection
file.  Each job signs what it writes to Kafka with a key derived from it, the
job's name and the Kafka cluster's id (HMAC-SHA256), so a record signed for
one job, or on another cluster (staging, with the same secret), does not
verify.  The store's files are signed with a key of their own
(``store_key``: the secret and the job, not Kafka, so a checkpoint can be
read while Kafka is away), which the store's signer binds to the store's
place.  The secret never comes from Kafka or the store, and no repr, log
line or error shows it."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from streaming.errors import ConfigError
from streaming.private_files import read_private, write_private

__all__ = ["JobKey", "MIN_SECRET_CHARS", "generate_secret", "kept_secret", "read_secret_file", "write_secret_file"]

# a secret shorter than this is refused: it could be guessed
MIN_SECRET_CHARS = 32
_DERIVATION = b"spark-abs job key\0"
_CLUSTER = b"kafka cluster\0"


def _root(secret: str, job: str) -> bytes:
    """What every key of job ``job`` is derived from; the secret checked for length."""
    if len(secret) < MIN_SECRET_CHARS:
        raise ConfigError(
            f"the job secret has {len(secret)} characters, fewer than {MIN_SECRET_CHARS}: "
            "generate one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )
    return hmac.new(secret.encode(), _DERIVATION + job.encode(), hashlib.sha256).digest()


def generate_secret() -> str:
    """A new secret: 256 random bits as URL-safe text."""
    return secrets.token_urlsafe(32)


def read_secret_file(path: Path, what: str = "the job secret file") -> str:
    """The secret in ``path``, which must be a regular file of this user's
    that only its owner can read or write (``read_private``: a ``ConfigError``
    that says how to fix it)."""
    return read_private(path, what).strip()


def kept_secret(path: Path, what: str = "the job secret file") -> str:
    """The secret in ``path``: generated there on first use (``write_secret_file``), then kept and
    read back checked (``read_secret_file``)."""
    if not path.exists():
        write_secret_file(path, generate_secret())
    return read_secret_file(path, what)


def write_secret_file(path: Path, secret: str) -> None:
    """Write ``secret`` to ``path``, created readable by its owner only
    (``write_private``: its directory created 0700 if missing)."""
    write_private(path, secret + "\n")


@dataclass(frozen=True, slots=True)
class JobKey:
    """Job ``job``'s signing key; ``sign`` and ``verify`` take the parts of
    a message (bytes), signed as one in order."""

    job: str
    key: bytes = field(repr=False)

    @classmethod
    def derive(cls, secret: str, job: str, *, cluster: str) -> JobKey:
        """Job ``job``'s key on the Kafka cluster whose id is ``cluster``, from the operator's ``secret``."""
        if not cluster:
            raise ConfigError("a job's key is bound to its Kafka cluster: give the cluster's id")
        bound = _root(secret, job)
        tagged = _CLUSTER + len(cluster).to_bytes(8, "big") + cluster.encode()
        return cls(job, hmac.new(bound, tagged, hashlib.sha256).digest())

    @staticmethod
    def store_key(secret: str, job: str) -> bytes:
        """The key job ``job``'s store files are signed with (``_JOB.json``, manifests,
        ``_TASK.json``: ``streaming.adapters.snapshots.signing``, which binds it to the
        store's place): one of its own, from the ``secret`` and the job, not Kafka."""
        return hmac.new(_root(secret, job), b"store", hashlib.sha256).digest()

    @property
    def barriers(self) -> bytes:
        """The key barriers and cancellations are signed with (``barriers.messages.encode``):
        one of its own, so that no signature of one kind of record passes for another's."""
        return hmac.new(self.key, b"barriers", hashlib.sha256).digest()

    def sign(self, *parts: bytes) -> str:
        digest = hmac.new(self.key, digestmod=hashlib.sha256)
        for part in parts:
            digest.update(len(part).to_bytes(8, "big") + part)
        return digest.hexdigest()

    def verify(self, signature: bytes | str | None, *parts: bytes) -> bool:
        """Whether ``signature`` is this key's over ``parts`` (in constant time)."""
        if signature is None:
            return False
        given = signature.encode("utf-8", "replace") if isinstance(signature, str) else signature
        # bytes on both sides: compare_digest refuses str that is not ASCII, and a writer chooses the header
        return hmac.compare_digest(given, self.sign(*parts).encode())
