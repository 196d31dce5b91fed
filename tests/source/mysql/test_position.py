"""Binlog positions map to int64s that sort as the binlog does."""

from __future__ import annotations

import pytest

from headrace.core.settings import redacted_dsn
from headrace.source.mysql.connect import parse_dsn
from headrace.source.mysql.position import format_position, from_int, to_int


def test_positions_round_trip_and_order() -> None:
    pos = to_int("binlog.000003", 1234)
    assert pos == (3 << 32) | 1234
    assert from_int(pos, "binlog") == ("binlog.000003", 1234)
    assert format_position(pos) == "000003:1234" and format_position(pos, "mysql-bin") == "mysql-bin.000003:1234"
    assert to_int("binlog.000002", 2**32 - 1) < to_int("binlog.000003", 4) < to_int("binlog.000003", 5)
    with pytest.raises(ValueError):
        to_int("binlog", 4)


def test_dsn_parsing_and_redaction() -> None:
    dsn = parse_dsn("mariadb://repl:s%40cret@db.example:3307/shop")
    assert (dsn.host, dsn.port, dsn.user, dsn.password, dsn.database) == ("db.example", 3307, "repl", "s@cret", "shop")
    assert parse_dsn("mysql://u@h/").port == 3306
    assert redacted_dsn("mysql://repl:secret@h:3306/shop") == "mysql://repl:***@h:3306/shop"
