"""Sizes in config files: source.max_retained_wal."""

from __future__ import annotations

import pytest

from headrace.core.size import format_size, parse_size


@pytest.mark.parametrize(("text", "expected"), [
    ("10GB", 10 << 30), ("512 MB", 512 << 20), ("1.5GiB", 3 << 29), ("2048", 2048), (4096, 4096), ("1kB", 1024),
])
def test_sizes_parse(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["10 GBs", "ten GB", "-1", "", "1.5.2MB"])
def test_bad_sizes_say_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="e.g. 10GB"):
        parse_size(text)


def test_sizes_format_for_people() -> None:
    assert format_size(10 << 30) == "10 GB"
    assert format_size(3 << 29) == "1.5 GB"
    assert format_size(100) == "100 bytes"
