"""Hypothesis profiles for the protocol tests: ``ci`` (derandomized, no
example database) when ``CI`` is set, ``dev`` otherwise.  Both keep the
whole directory well under a minute."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

settings.register_profile("ci", max_examples=60, derandomize=True, database=None, print_blob=True, **_common)
settings.register_profile("dev", max_examples=100, **_common)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
