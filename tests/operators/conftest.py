"""Hypothesis settings for the operator tests.

One profile, ``operators``, applied by the property tests themselves
(``@settings(settings.get_profile("operators"))``) so that loading it does not
change other packages' Hypothesis tests.  Examples are capped to keep the
whole directory well under 30 s; with ``CI`` set the profile is derandomized
(the same examples every run, no example database)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_common = dict(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

if os.environ.get("CI"):
    settings.register_profile("operators", derandomize=True, database=None, print_blob=True, **_common)
else:
    settings.register_profile("operators", **_common)
