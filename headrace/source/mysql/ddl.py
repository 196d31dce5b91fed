"""What a DDL statement in the binlog (a QueryEvent) does to tables and columns the stream tracks.

Only the shapes that change an identity are read: column renames and drops (``ALTER TABLE ...
RENAME COLUMN a TO b``, ``CHANGE [COLUMN] a b <type>``, ``DROP [COLUMN] a``), table renames
(``RENAME TABLE a TO b, ...``, ``ALTER TABLE a RENAME [TO|AS] b``), ``DROP TABLE`` and ``CREATE
[OR REPLACE] TABLE``. Types, added columns and defaults come from the next TABLE_MAP and the
catalog, never from the statement text. A small tokenizer rather than a SQL parser library: these
few shapes are fixed grammar (MariaDB also writes ``DROP TABLE`` back with a trailing comment), and
a parser that fails on one MariaDB-only clause of an ALTER would lose the rename in it; here
unknown clauses are skipped one comma-separated item at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

Name = tuple[str, str]  # (database, table)

_TOKEN = re.compile(
    r"\s+|/\*.*?\*/|--[^\n]*|#[^\n]*"  # space and comments (skipped)
    r"|(`(?:[^`]|``)*`)"  # 1: quoted identifier
    r"|('(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\")"  # 2: string
    r"|([A-Za-z0-9_$\u0080-\uffff]+)"  # 3: word or bare identifier
    r"|(.)", re.DOTALL)  # 4: punctuation


@dataclass(frozen=True)
class Token:
    """A word (upper-cased in ``word``), an identifier (``text`` unquoted) or punctuation."""

    text: str
    quoted: bool = False

    @property
    def word(self) -> str:
        return "" if self.quoted else self.text.upper()


@dataclass
class Ddl:
    """What one statement does: column renames/drops per table, table renames, drops, creates."""

    renamed_columns: dict[Name, list[tuple[str, str]]] = field(default_factory=dict)  # table -> (old, new)
    dropped_columns: dict[Name, list[str]] = field(default_factory=dict)
    renamed_tables: list[tuple[Name, Name]] = field(default_factory=list)  # in statement order
    dropped_tables: list[Name] = field(default_factory=list)
    created_tables: list[Name] = field(default_factory=list)
    replaced_tables: list[Name] = field(default_factory=list)  # CREATE OR REPLACE: dropped if it existed


def tokens(sql: str) -> list[Token]:
    """``sql`` as tokens, comments dropped."""
    out = []
    for m in _TOKEN.finditer(sql):
        if m.group(1):
            out.append(Token(m.group(1)[1:-1].replace("``", "`"), quoted=True))
        elif m.group(2):
            out.append(Token(m.group(2), quoted=True))
        elif m.group(3):
            out.append(Token(m.group(3)))
        elif m.group(4):
            out.append(Token(m.group(4)))
    return out


def _name(ts: list[Token], i: int, default_db: str) -> tuple[Name, int]:
    """A possibly database-qualified table name at ``ts[i]``; returns it and the index after it."""
    if i + 2 < len(ts) and ts[i + 1].text == "." and not ts[i + 1].quoted:
        return (ts[i].text, ts[i + 2].text), i + 3
    return (default_db, ts[i].text), i + 1


def _skip(ts: list[Token], i: int, *words: str) -> int:
    """The index after the optional keywords ``words`` found in order from ``i``."""
    for w in words:
        if i < len(ts) and ts[i].word == w:
            i += 1
    return i


def _items(ts: list[Token], i: int) -> list[list[Token]]:
    """The comma-separated items from ``i`` (commas inside parentheses do not separate)."""
    items: list[list[Token]] = [[]]
    depth = 0
    for t in ts[i:]:
        if not t.quoted and t.text == "(":
            depth += 1
        elif not t.quoted and t.text == ")":
            depth -= 1
        elif not t.quoted and t.text == "," and depth == 0:
            items.append([])
            continue
        items[-1].append(t)
    return [item for item in items if item]


def parse(sql: str, default_db: str) -> Ddl:
    """What ``sql`` does to tables and columns (an empty ``Ddl`` for anything else)."""
    ddl = Ddl()
    ts = tokens(sql)
    head = [t.word for t in ts[:4]]
    if not ts:
        return ddl
    if head[0] == "RENAME" and head[1:2] == ["TABLE"]:
        for item in _items(ts, 2):
            if len(item) >= 3:
                old, j = _name(item, 0, default_db)
                j = _skip(item, j, "TO")
                if j < len(item):
                    ddl.renamed_tables.append((old, _name(item, j, default_db)[0]))
    elif head[0] == "DROP":
        if head[1:2] == ["TABLE"]:  # DROP TEMPORARY TABLE drops no base table
            for item in _items(ts, _skip(ts, 2, "IF", "EXISTS")):
                ddl.dropped_tables.append(_name(item, 0, default_db)[0])
    elif head[0] == "CREATE":
        i = _skip(ts, 1, "OR", "REPLACE")
        replace = i > 1
        if i < len(ts) and ts[i].word == "TABLE":  # CREATE TEMPORARY TABLE shadows, never replaces: skipped
            i = _skip(ts, i + 1, "IF", "NOT", "EXISTS")
            if i < len(ts):
                (ddl.replaced_tables if replace else ddl.created_tables).append(_name(ts, i, default_db)[0])
    elif head[0] == "ALTER":
        i = _skip(ts, 1, "ONLINE", "IGNORE")
        if i < len(ts) and ts[i].word == "TABLE":
            i = _skip(ts, i + 1, "IF", "EXISTS")
            if i < len(ts):
                table, i = _name(ts, i, default_db)
                for item in _items(ts, i):
                    _alter_item(ddl, table, item, default_db)
    return ddl


def _alter_item(ddl: Ddl, table: Name, item: list[Token], default_db: str) -> None:
    """One ``ALTER TABLE`` specification (what it does to identities; the rest is skipped)."""
    verb = item[0].word
    if verb == "RENAME":
        if len(item) >= 4 and item[1].word == "COLUMN":
            j = _skip(item, 2, "IF", "EXISTS")
            if j + 2 < len(item) and item[j + 1].word == "TO":
                ddl.renamed_columns.setdefault(table, []).append((item[j].text, item[j + 2].text))
        elif len(item) >= 2 and item[1].word not in ("INDEX", "KEY", "CONSTRAINT"):
            j = _skip(item, 1, "TO", "AS")
            if j < len(item):
                ddl.renamed_tables.append((table, _name(item, j, default_db)[0]))
    elif verb == "CHANGE":
        j = _skip(item, 1, "COLUMN", "IF", "EXISTS")
        if j + 1 < len(item) and item[j].text != item[j + 1].text:
            ddl.renamed_columns.setdefault(table, []).append((item[j].text, item[j + 1].text))
    elif verb == "DROP" and len(item) >= 2:
        if item[1].word in ("INDEX", "KEY", "PRIMARY", "FOREIGN", "CONSTRAINT", "CHECK", "PARTITION",
                            "PERIOD", "SYSTEM"):
            return
        j = _skip(item, 1, "COLUMN", "IF", "EXISTS")
        if j < len(item):
            ddl.dropped_columns.setdefault(table, []).append(item[j].text)


_TRUNCATE = re.compile(r"^\s*TRUNCATE\s+(?:TABLE\s+)?(?:`((?:[^`]|``)+)`|(\w+))(?:\.(?:`((?:[^`]|``)+)`|(\w+)))?\s*$",
                       re.IGNORECASE)


def truncated_table(query: str, default_db: str) -> tuple[str, str] | None:
    """The (database, table) a ``TRUNCATE [TABLE] [db.]t`` statement empties, or None for another statement."""
    match = _TRUNCATE.match(query)
    if match is None:
        return None
    first = (match.group(1) or "").replace("``", "`") or match.group(2)
    second = (match.group(3) or "").replace("``", "`") or match.group(4)
    return (first, second) if second else (default_db, first)
