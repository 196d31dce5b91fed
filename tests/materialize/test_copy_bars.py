"""The copy's terminal progress bars (``materialize.copy_bars``): drawn on a terminal only, one per table."""

from __future__ import annotations

import io

from headrace.materialize.copy_bars import CopyBars


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_two_tables_copied_side_by_side_get_a_bar_each_and_close_with_their_last_chunk() -> None:
    screen = Terminal()
    bars = CopyBars(screen)
    bars.show('public."Order Items"', 1, 4, 1_000)
    bars.show("public.ünïcode", 1, 2, 50)
    bars.show('public."Order Items"', 3, 4, 3_000)
    bars.show("public.ünïcode", 2, 2, 100)
    bars.show('public."Order Items"', 4, 4, 4_000)
    text = screen.getvalue()
    assert "4/4" in text and "2/2" in text
    assert "4,000 rows" in text and "public.ünïcode" in text
    assert not bars._bars  # both closed


def test_nothing_is_drawn_when_the_stream_is_not_a_terminal() -> None:
    log = io.StringIO()
    CopyBars(log).show("public.t", 1, 1, 10)
    assert log.getvalue() == ""
