"""Object storage for snapshots and sink output, through ``pyarrow.fs``:
``file://`` (the embedded default) or ``s3://bucket/prefix`` against any S3 API
server.  One function turns a URI and a connection into a filesystem and a
path (``open_store``); ``ObjectFiles`` is the file I/O the snapshot store and
the sinks share: whole-file reads and writes (atomic where asked), deletes
that S3 servers with real directories accept, and every ``OSError`` turned
into a ``StoreError`` that names the store.  ``store_patiently`` retries a read
while the store is unreachable (a restore during a store outage)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from streaming.api.config import Connection
from streaming.api.settings import check_store_uri
from streaming.errors import ConfigError, SnapshotCorruptError, SnapshotMissingError, StoreError
from streaming.waits import retry

__all__ = [
    "STORE_BOUND_S",
    "StoreLocation",
    "ObjectFiles",
    "open_store",
    "store_patiently",
    "s3_filesystem",
    "ensure_bucket",
    "list_files",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """A filesystem and the root path inside it (no scheme, no trailing slash)."""

    filesystem: pafs.FileSystem
    root: str
    uri: str

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *(p.strip("/") for p in parts if p)])


def s3_filesystem(
    connection: Connection, *, allow_bucket_creation: bool = False, max_attempts: int | None = None
) -> pafs.S3FileSystem:
    """The S3 server of ``connection``; ``max_attempts`` caps the attempts per
    request (None = pyarrow's default retry strategy)."""
    endpoint = urlparse(connection.s3_endpoint)
    retry = (
        {} if max_attempts is None else {"retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=max_attempts)}
    )
    return pafs.S3FileSystem(
        access_key=connection.s3_access_key,
        secret_key=connection.s3_secret_key,
        region=connection.s3_region,
        # pyarrow ignores AWS_ENDPOINT_URL_S3: both must be passed explicitly.
        endpoint_override=endpoint.netloc,
        scheme=endpoint.scheme,
        allow_bucket_creation=allow_bucket_creation,
        connect_timeout=5,
        request_timeout=30,
        **retry,
    )


def open_store(uri: str, connection: Connection | None = None, *, create: bool = True) -> StoreLocation:
    """``file:///abs/dir`` or a plain path -> local filesystem; ``s3://bucket/prefix``
    -> the S3 server of ``connection``.  A local directory that does not exist
    is made, or with ``create=False`` (a command that only reads) an error."""
    check_store_uri(uri)
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        root = Path(parsed.path if parsed.scheme else uri).expanduser().resolve()
        if create:
            root.mkdir(parents=True, exist_ok=True)
        elif not root.is_dir():
            raise StoreError(f"store {uri!r}: there is no directory {root} (is --store right?)")
        return StoreLocation(pafs.LocalFileSystem(), str(root), f"file://{root}")
    if parsed.scheme == "s3":
        if connection is None:
            raise ConfigError(f"store {uri!r} is on S3 but no S3 connection is configured")
        if not parsed.netloc:
            raise ConfigError(f"store {uri!r} names no bucket (expected s3://bucket/prefix)")
        key = f"{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
        return StoreLocation(s3_filesystem(connection), key, f"s3://{key}")
    raise ConfigError(f"store {uri!r}: unsupported scheme {parsed.scheme!r} (use file:// or s3://)")


# how long a restore waits for an unreachable store before it gives up
STORE_BOUND_S = 120.0


def store_patiently(read: Callable[[], T], what: str, bound_s: float = STORE_BOUND_S) -> T:
    """``read()`` again while the store is unreachable (a ``StoreError`` that
    is not about a missing or corrupt file), for at most ``bound_s``, with
    growing pauses, each one logged as a warning (``waits.retry``); then a
    ``StoreError`` naming ``what``, the bound and the last failure."""

    def unreachable(exc: BaseException) -> bool:
        return isinstance(exc, StoreError) and not isinstance(exc, (SnapshotMissingError, SnapshotCorruptError))

    return retry(
        read,
        bound_s,
        what,
        retry_on=unreachable,
        bound="STORE_BOUND_S" if bound_s == STORE_BOUND_S else None,
        first_s=1.0,
        max_s=10.0,
        cause="the store looks unreachable",
        logger=log,
        error=StoreError,
    )


def ensure_bucket(connection: Connection) -> None:
    """Create the connection's bucket if it does not exist yet."""
    fs = s3_filesystem(connection, allow_bucket_creation=True)
    try:
        if fs.get_file_info(connection.s3_bucket).type == pafs.FileType.NotFound:
            fs.create_dir(connection.s3_bucket)
    except OSError as exc:
        raise StoreError(
            f"S3 server at {connection.s3_endpoint}: cannot check or create bucket {connection.s3_bucket!r}: {exc}"
        ) from exc


def list_files(fs: pafs.FileSystem, directory: str) -> list[pafs.FileInfo]:
    """Every file under ``directory`` (recursively; none when it is missing), by path."""
    selector = pafs.FileSelector(directory, recursive=True, allow_not_found=True)
    return sorted((i for i in fs.get_file_info(selector) if i.type == pafs.FileType.File), key=lambda i: i.path)


class ObjectFiles:
    """Whole files in one ``StoreLocation``.  ``what`` names the store in
    errors (``"snapshot store"``)."""

    def __init__(self, location: StoreLocation, what: str = "store"):
        self.location = location
        self.what = what
        self.fs = location.filesystem
        self.local = self.fs.type_name == "local"

    def uri(self, path: str) -> str:
        return f"{'file://' if self.local else 's3://'}{path}"

    @contextmanager
    def io(self, what: str) -> Iterator[None]:
        """Turn an ``OSError`` inside into a ``StoreError``: ``<store> <uri>: <what> failed: <why>``."""
        try:
            yield
        except OSError as exc:
            raise StoreError(f"{self.what} {self.location.uri}: {what} failed: {exc}") from exc

    def write(self, path: str, data: bytes | pa.Buffer, *, atomic: bool = False) -> None:
        """Callers hold ``io``.  ``atomic``: readers see the old file or the new
        one, never a part (rename locally; one PUT on S3 is atomic anyway)."""
        if self.local:
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        target = f"{path}.tmp-{uuid.uuid4().hex}" if atomic and self.local else path
        with self.fs.open_output_stream(target) as out:
            out.write(data)
        if target != path:
            self.fs.move(target, path)

    def write_parquet(self, path: str, table: pa.Table) -> None:
        """``table`` as one Parquet file (one PUT on S3: it appears whole or
        not at all), its directory created first.  Raises ``OSError``."""
        self.fs.create_dir(path.rsplit("/", 1)[0])
        pq.write_table(table, path, filesystem=self.fs)

    def read(self, path: str, what: str) -> bytes | None:
        """The whole file, or None when it does not exist."""
        with self.io(what):
            try:
                with self.fs.open_input_stream(path) as stream:
                    return stream.read()
            except FileNotFoundError:
                return None

    def clear(self, path: str, *, remove: bool = False) -> None:
        """Delete everything under ``path`` (and ``path`` itself with ``remove``);
        a missing ``path`` is fine.  Callers hold ``io``.  On S3, files go one
        by one before their directories: servers that keep real directories
        (versitygw's POSIX backend) reject a batch delete naming a directory
        before its contents."""
        if self.local:
            try:
                if remove:
                    self.fs.delete_dir(path)
                else:
                    self.fs.delete_dir_contents(path, missing_dir_ok=True)
            except FileNotFoundError:
                pass
            return
        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        found = self.fs.get_file_info(selector)
        for info in found:
            if info.type == pafs.FileType.File:
                self.fs.delete_file(info.path)
        if remove and (found or self.fs.get_file_info(path).type == pafs.FileType.Directory):
            self.fs.delete_dir(path)
