"""The write mode an Iceberg table's size asks for (``write_mode.wanted_mode``); the switch itself,
with the rows it leaves, is in test_iceberg_target.py."""

from __future__ import annotations

from headrace.targets.iceberg.write_mode import COPY_ON_WRITE as COW
from headrace.targets.iceberg.write_mode import COPY_ON_WRITE_MAX_BYTES as MAX_BYTES
from headrace.targets.iceberg.write_mode import MERGE_ON_READ as MOR
from headrace.targets.iceberg.write_mode import chosen_by_owner, wanted_mode


def test_small_tables_are_copy_on_write_large_ones_merge_on_read_with_a_gap_between() -> None:
    assert wanted_mode(None, 0, MOR, 100) == COW  # no snapshot yet
    assert wanted_mode(99, 1000, MOR, 100) == COW
    assert wanted_mode(150, 1000, MOR, 100) == MOR  # between the limits: as it is
    assert wanted_mode(150, 1000, COW, 100) == COW
    assert wanted_mode(200, 1000, COW, 100) == MOR
    assert wanted_mode(10, MAX_BYTES, COW, 100) == COW  # few but wide rows: the bytes limit
    assert wanted_mode(10, MAX_BYTES, MOR, 100) == MOR
    assert wanted_mode(10, 2 * MAX_BYTES, COW, 100) == MOR
    assert wanted_mode(10, 0, COW, 0) == MOR  # 0: copy-on-write off


def test_a_mode_the_owner_set_is_theirs() -> None:
    """Only a write.merge.mode other than the one headrace recorded is the owner's; a table from before
    the record, or in the mode headrace set, follows its size."""
    assert not chosen_by_owner({})
    assert not chosen_by_owner({"write.merge.mode": MOR})  # created before the record
    assert not chosen_by_owner({"write.merge.mode": COW, "headrace.write-mode": COW})
    assert chosen_by_owner({"write.merge.mode": COW, "headrace.write-mode": MOR})
