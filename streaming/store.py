"""Object storage for snapshots and sink output, through ``pyarrow.fs``:
``file://`` (the embedded default) or ``s3://bucket/prefix`` against any S3 API
server.  One function turns a URI and a connection into a filesystem and a path."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs

from streaming.config import Connection
from streaming.errors import ConfigError, StoreError

__all__ = ["StoreLocation", "open_store", "s3_filesystem", "ensure_bucket"]


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """A filesystem and the root path inside it (no scheme, no trailing slash)."""

    filesystem: pafs.FileSystem
    root: str
    uri: str

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *(p.strip("/") for p in parts if p)])


def s3_filesystem(connection: Connection, *, allow_bucket_creation: bool = False,
                  max_attempts: int | None = None) -> pafs.S3FileSystem:
    """The S3 server of ``connection``; ``max_attempts`` caps the attempts per
    request (None = pyarrow's default retry strategy)."""
    endpoint = urlparse(connection.s3_endpoint)
    retry = {} if max_attempts is None else {
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=max_attempts)}
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


def open_store(uri: str, connection: Connection | None = None) -> StoreLocation:
    """``file:///abs/dir`` or a plain path -> local filesystem; ``s3://bucket/prefix``
    -> the S3 server of ``connection``."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        root = Path(parsed.path if parsed.scheme else uri).expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
        return StoreLocation(pafs.LocalFileSystem(), str(root), f"file://{root}")
    if parsed.scheme == "s3":
        if connection is None:
            raise ConfigError(f"store {uri!r} is on S3 but no S3 connection is configured")
        if not parsed.netloc:
            raise ConfigError(f"store {uri!r} names no bucket (expected s3://bucket/prefix)")
        root = f"{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
        return StoreLocation(s3_filesystem(connection), root, f"s3://{root}")
    raise ConfigError(f"store {uri!r}: unsupported scheme {parsed.scheme!r} (use file:// or s3://)")


def ensure_bucket(connection: Connection) -> None:
    """Create the connection's bucket if it does not exist yet."""
    fs = s3_filesystem(connection, allow_bucket_creation=True)
    try:
        if fs.get_file_info(connection.s3_bucket).type == pafs.FileType.NotFound:
            fs.create_dir(connection.s3_bucket)
    except OSError as exc:
        raise StoreError(f"S3 server at {connection.s3_endpoint}: cannot check or create bucket "
                         f"{connection.s3_bucket!r}: {exc}") from exc
