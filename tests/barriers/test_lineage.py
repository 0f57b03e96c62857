"""Stale records across several restores."""

from __future__ import annotations

import pytest

from barriers.lineage import Lineage
from barriers.messages import ChannelId

C = ChannelId("t", 0)


def test_records_after_the_restored_position_are_stale_for_older_generations_only():
    lineage = Lineage().after_restore(1, {C: 100})
    assert lineage.is_stale(C, 0, 100) and not lineage.is_stale(C, 0, 99)
    assert not lineage.is_stale(C, 1, 500)


def test_a_slice_stale_for_an_earlier_restore_stays_stale():
    # generation 2 restored at 50: generation 1's records from 50 on are stale;
    # generation 4 restores a checkpoint of generation 2 whose barrier is at 968
    lineage = Lineage().after_restore(2, {C: 50}).after_restore(4, {C: 969})
    assert lineage.is_stale(C, 1, 940)  # stale since generation 2, although before 969
    assert not lineage.is_stale(C, 1, 49)
    assert not lineage.is_stale(C, 2, 940)  # generation 2's own records before 969 are channel state
    assert lineage.is_stale(C, 3, 1200) and lineage.is_stale(C, 2, 969)


def test_a_restore_from_the_beginning_makes_everything_older_stale():
    lineage = Lineage().after_restore(3, None)
    assert lineage.is_stale(C, 2, 0) and not lineage.is_stale(C, 3, 0)


def test_lineage_round_trips_and_rejects_nonsense():
    lineage = Lineage().after_restore(2, {C: 5}).after_restore(3, None)
    assert Lineage.from_json(lineage.to_json()) == lineage
    with pytest.raises(ValueError, match="does not come after"):
        lineage.after_restore(3, {})
    with pytest.raises(ValueError, match="lineage"):
        Lineage.from_json([["x", {}]])
