"""The local S3 API server: versitygw with its POSIX backend, serving one
bucket from a directory under the runtime directory.

versitygw was chosen over MinIO (a long source build) and s3proxy (its
filesystem backend rejects the checksummed multipart uploads that pyarrow's
AWS SDK sends by default, and lists multipart leftovers as objects): it is one
``go install``, real S3 semantics on plain files, conditional writes included.
"""

from __future__ import annotations

from pathlib import Path

from streaming.local.processes import ServiceSpec

__all__ = ["server_spec"]


def server_spec(binary: Path, runtime_dir: Path, port: int, access_key: str, secret_key: str) -> ServiceSpec:
    data_dir = runtime_dir / "s3" / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    return ServiceSpec(
        name="s3",
        argv=[str(binary), "--port", f"127.0.0.1:{port}", "posix", str(data_dir)],
        env={"ROOT_ACCESS_KEY": access_key, "ROOT_SECRET_KEY": secret_key},
        log_path=runtime_dir / "logs" / "s3.out",
        pid_path=runtime_dir / "pids" / "s3.pid",
        marker=str(data_dir),
    )
