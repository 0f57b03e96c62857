"""Fault points armed through a fault file (what a drill does to a running
worker): read again when it changes, by generation, and never half-written."""

from __future__ import annotations

import pytest

from streaming.engine import faults


@pytest.fixture
def fault_file(tmp_path, monkeypatch):
    path = tmp_path / "faults"
    monkeypatch.setenv(faults.FILE_ENV, str(path))
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.set_generation(2)
    yield path
    faults.set_generation(0)


def test_a_fault_written_to_the_file_arms_the_running_worker_and_clearing_it_disarms(fault_file):
    assert not faults._armed("accounts-0", "during_upload", 5)  # no file yet
    faults.arm(str(fault_file), ["accounts-0:during_upload:*:2"])
    assert faults._armed("accounts-0", "during_upload", 5)
    assert not faults._armed("accounts-1", "during_upload", 5)
    assert not faults._armed("accounts-0", "mid_batch", 5)
    faults.arm(str(fault_file), [])
    assert not faults._armed("accounts-0", "during_upload", 5)


def test_a_fault_for_another_generation_waits(fault_file):
    faults.arm(str(fault_file), ["windows-0:during_restore:*:3"])
    assert not faults._armed("windows-0", "during_restore", 4)
    faults.set_generation(3)
    assert faults._armed("windows-0", "during_restore", 4)


def test_the_file_and_the_variable_add_up_and_a_bad_entry_is_named(fault_file, monkeypatch):
    monkeypatch.setenv(faults.ENV, "legs-0:mid_batch:7:2")
    faults.arm(str(fault_file), ["legs-1:mid_batch:*:2"])
    assert faults._armed("legs-0", "mid_batch", 7) and faults._armed("legs-1", "mid_batch", 9)
    faults.arm(str(fault_file), ["legs-1:nowhere:*:2"])
    with pytest.raises(ValueError, match="legs-1:nowhere"):
        faults._armed("legs-1", "mid_batch", 9)
    assert sorted(p.name for p in fault_file.parent.iterdir()) == ["faults"]  # no temporary file left
