"""A job's settings (``streaming.api.settings.JobSettings``): what a record
its stage's code raises on does, the brake, and the records an operator
names to skip, each refused with a ``ConfigError`` that says the form when
it cannot mean anything."""

from __future__ import annotations

import pytest

from streaming.api.settings import JobSettings, skip_range
from streaming.errors import ConfigError


def test_a_record_error_policy_and_its_brake_are_checked():
    settings = JobSettings(store="file:///tmp/s")
    assert (settings.record_errors, settings.max_isolated_records, settings.max_isolated_share) == (
        "isolate",
        1000,
        0.5,
    )
    assert (
        JobSettings.from_json(JobSettings(store="file:///tmp/s", record_errors="fail").to_json()).record_errors
        == "fail"
    )
    with pytest.raises(ConfigError, match="record_errors 'drop': use 'isolate' or 'fail'"):
        JobSettings(store="file:///tmp/s", record_errors="drop")
    with pytest.raises(ConfigError, match="max_isolated_records must be 0 or more"):
        JobSettings(store="file:///tmp/s", max_isolated_records=-1)
    with pytest.raises(ConfigError, match="max_isolated_share must be more than 0 and at most 1"):
        JobSettings(store="file:///tmp/s", max_isolated_share=0)


def test_records_to_skip_are_named_by_topic_partition_and_offsets():
    assert skip_range("money.transfers:1:40-199") == ("money.transfers", 1, 40, 199)
    settings = JobSettings(store="file:///tmp/s", skip_records=["a:0:1-1"])
    assert JobSettings.from_json(settings.to_json()).skip_records == ("a:0:1-1",)
    for wrong in ("a:0:5-4", "a:x:1-2", "a:0:12", "0:1-2", "a:0:-3"):
        with pytest.raises(ConfigError, match="give topic:partition:first-last"):
            JobSettings(store="file:///tmp/s", skip_records=[wrong])
