"""Without ``headrace._speedups`` (no C compiler at install) there is no undecoded codec: the
PostgreSQL source streams decoded events only and capture stages them as it always did."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["headrace._speedups"] = None  # import fails: as if it was never built
    from headrace.capture.buffer import TableBuffer, stage
    from headrace.core.changes import Begin
    from headrace.core.schema import Column, ColumnType, TableSchema, TypeKind
    from headrace.log import codec
    from headrace.source.postgres import pgoutput, replication

    assert pgoutput.UNDECODED is None and pgoutput._native_tuple is None and codec._native_object is None
    assert replication.UNDECODED is None  # so the stream decodes every message, raw_changes or not
    assert pgoutput.stream_head is pgoutput.python_stream_head  # streamed blocks decoded in Python
    inside = pgoutput.decode(b"D" + (9).to_bytes(4, "big") + (7).to_bytes(4, "big") + b"K\\x00\\x01t\\x00\\x00\\x00\\x011",
                             streamed=True)
    assert inside.xid == 9 and inside.event.relation_oid == 7 and inside.event.old == ("1",), inside
    text = ColumnType(TypeKind.STRING, "text")
    schema = TableSchema(7, "public", "t", (Column("id", text, 25), Column("doc", text, 25)), ("id",))
    msg = b"U" + (7).to_bytes(4, "big") + b"K\\x00\\x02t\\x00\\x00\\x00\\x011n" + b"N\\x00\\x02t\\x00\\x00\\x00\\x012u"
    buffers = {}
    added = stage(pgoutput.decode(msg), Begin(1, 2, 3), 1, {7: schema}, buffers)
    buf = buffers[7].buffer
    assert added == buf.nbytes
    assert (buf.data, buf.unchanged, buf.old_key) == (['{"id":"2"}'], ["doc"], ['{"id":"1"}']), buf
    print("ok")
""")


def test_capture_stages_decoded_events_without_the_native_module() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
