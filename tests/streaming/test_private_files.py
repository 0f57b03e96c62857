"""Owner-only and atomic local files: written whole (a reader sees the old
file or the new one), created 0600 and never widened, and read as a secret
only from a regular file of this user's that no one else may read or write."""

from __future__ import annotations

import os
import stat

import pytest

from streaming.errors import ConfigError
from streaming.private_files import read_private, replace_into, write_atomically, write_private

OTHER_UID = 65534  # nobody


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_private_creates_the_file_0600_and_never_widens_one(tmp_path):
    path = tmp_path / "secret"
    write_private(path, "a")
    assert _mode(path) == 0o600 and path.read_text() == "a"
    path.chmod(0o644)  # a file others could read is replaced by one they cannot, not written in place
    write_private(path, b"b")
    assert _mode(path) == 0o600 and path.read_text() == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]  # no temporary file left


def test_write_private_creates_its_directory_0700_and_leaves_one_there_as_it_is(tmp_path):
    path = tmp_path / "new" / "secret"
    write_private(path, "a")
    assert _mode(path.parent) == 0o700 and _mode(path) == 0o600 and path.read_text() == "a"
    tmp_path.chmod(0o755)
    write_private(tmp_path / "other", "b")
    assert _mode(tmp_path) == 0o755


def test_write_atomically_gives_the_mode_asked_for_or_a_new_files_default(tmp_path):
    umask = os.umask(0o022)
    try:
        write_atomically(tmp_path / "plain", "text")
        write_atomically(str(tmp_path / "shared"), b"bytes", mode=0o644)
    finally:
        os.umask(umask)
    assert _mode(tmp_path / "plain") == 0o644 and (tmp_path / "plain").read_text() == "text"
    assert _mode(tmp_path / "shared") == 0o644 and (tmp_path / "shared").read_bytes() == b"bytes"


def test_a_write_that_fails_midway_keeps_the_old_file_whole_and_leaves_nothing_behind(tmp_path, monkeypatch):
    path = tmp_path / "targets.json"
    write_atomically(path, "old\n")

    def failing_replace(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, "new\n")
    with pytest.raises(OSError, match="No space left"):
        write_private(path, "new\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["targets.json"]


def test_a_built_file_is_replaced_into_place(tmp_path):
    built, target = tmp_path / ".build" / "helper.jar", tmp_path / "helper.jar"
    built.parent.mkdir()
    built.write_bytes(b"new jar")
    target.write_bytes(b"old jar")
    replace_into(built, target)
    assert target.read_bytes() == b"new jar" and not built.exists()


def test_read_private_reads_a_file_of_its_owners_alone(tmp_path):
    path = tmp_path / "token"
    write_private(path, "the secret\n")
    assert read_private(path, "the token file") == "the secret\n"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_a_file_others_may_read_or_write_is_refused_naming_it_and_saying_chmod_600(tmp_path, mode):
    path = tmp_path / "job.secret"
    write_private(path, "the secret\n")
    path.chmod(mode)
    with pytest.raises(ConfigError) as refused:
        read_private(path, "the job secret file")
    assert str(refused.value) == (
        f"the job secret file {path} can be read by others (mode {mode:o}): "
        f"`chmod 600 {path}`, and choose a new secret if others could read it"
    )
    assert "the secret" not in str(refused.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid takes root (os.chown)")
def test_a_file_of_another_user_is_refused_naming_it_the_owner_and_the_fix(tmp_path):
    path = tmp_path / "job.secret"
    write_private(path, "the secret\n")
    os.chown(path, OTHER_UID, -1)
    assert _mode(path) == 0o600
    with pytest.raises(ConfigError) as refused:
        read_private(path, "the job secret file")
    message = str(refused.value)
    assert message.startswith(f"the job secret file {path} belongs to uid {OTHER_UID}, not to this user (uid 0): ")
    assert f"`chown 0 {path}`" in message and f"`chmod 600 {path}`" in message
    assert "the secret" not in message


def test_what_is_not_a_readable_regular_file_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=rf"^the token file {tmp_path / 'absent'} cannot be read: No such file"):
        read_private(tmp_path / "absent", "the token file")
    with pytest.raises(ConfigError, match=rf"^the token file {tmp_path} is not a regular file$"):
        read_private(tmp_path, "the token file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ConfigError, match=rf"^the token file {fifo} is not a regular file$"):
        read_private(fifo, "the token file")  # refused, not waited on
    binary = tmp_path / "binary"
    write_private(binary, b"\xff\xfe")
    with pytest.raises(ConfigError, match=rf"^the token file {binary} cannot be read: 'utf-8' codec"):
        read_private(binary, "the token file")
