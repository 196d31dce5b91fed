"""The status page at ``/``: server-rendered HTML, inline CSS and a little JS, no external assets."""

from __future__ import annotations

import json
import time
from html import escape
from typing import Any

from headrace.control.metrics import LAG_WINDOW_SECONDS, MeteredRun
from headrace.control.status import copy_blocks_sentence, error_summary

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#1d2430;background:#f7f8fa}
h1{font-size:1.3rem;margin:0 0 .2rem} .sub{color:#5b6475;margin-bottom:1rem}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002;width:100%}
th,td{padding:.45rem .7rem;border-bottom:1px solid #e6e8ee;text-align:left;vertical-align:middle}
th{background:#eef0f4;font-weight:600} td.n{text-align:right;font-variant-numeric:tabular-nums}
.st{padding:.1rem .45rem;border-radius:.6rem;font-size:12px;font-weight:600;color:#fff}
.STREAMING{background:#2e8540}.CATCHUP{background:#3a6fd8}.SNAPSHOT,.PENDING{background:#8a63d2}
.PAUSED{background:#9a9a9a}.ERRORED{background:#c62828}
.err{color:#c62828;max-width:28rem;font-size:12px;word-break:break-word}
button{margin:0 .15rem;padding:.2rem .55rem;border:1px solid #b8bfcc;border-radius:4px;background:#fff;cursor:pointer}
button:hover{background:#eef0f4} .bar{display:flex;gap:1.5rem;align-items:center;margin:.6rem 0 1rem}
.ok{color:#2e8540;font-weight:600}.bad{color:#c62828;font-weight:600} #msg{color:#c62828;margin:.5rem 0}
svg{vertical-align:middle} #lag-chart{margin:.2rem 0 1rem} #lag-chart svg{background:#fff;box-shadow:0 1px 2px #0002}
"""

_JS = """
const AUTH = %s;
function token(){ let t = sessionStorage.getItem('headraceToken');
  if (AUTH && !t) { t = prompt('API token'); if (t) sessionStorage.setItem('headraceToken', t); } return t; }
async function act(method, url, body){
  const headers = {'Content-Type': 'application/json'}; const t = token();
  if (t) headers['Authorization'] = 'Bearer ' + t;
  const r = await fetch(url, {method, headers, body: body ? JSON.stringify(body) : undefined});
  if (r.status === 401) sessionStorage.removeItem('headraceToken');
  if (!r.ok) { const j = await r.json().catch(() => ({})); document.getElementById('msg').textContent =
      method + ' ' + url + ': ' + (j.error || r.status); return; }
  location.reload();
}
function tableAct(name, what){ act('POST', '/api/tables/' + encodeURIComponent(name) + '/' + what); }
function addTable(){ const v = document.getElementById('add').value.trim(); if (v) act('POST', '/api/tables', {table: v}); }
setInterval(() => { if (!document.activeElement || document.activeElement.tagName !== 'INPUT') location.reload(); }, 5000);
"""


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = int(n / 1024)
    return f"{n:.1f} TiB"


def _sparkline(values: list[float], width: int = 120, height: int = 24) -> str:
    if len(values) < 2:
        return '<span class="sub">collecting…</span>'
    top = max(values) or 1.0
    step = width / (len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(values))
    return (f'<svg width="{width}" height="{height}" role="img" aria-label="throughput">'
            f'<polyline fill="none" stroke="#3a6fd8" stroke-width="1.5" points="{points}"/></svg>')


_COLOURS = ("#3a6fd8", "#c62828", "#2e8540", "#8a63d2", "#d97a00", "#00838f")


def _lag_text(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def lag_chart(samples: list[tuple[float, dict[str, float | None]]], now: float,
              window: float = LAG_WINDOW_SECONDS, width: int = 720, height: int = 110) -> str:
    """An SVG chart of each table's lag (seconds) over the last ``window`` seconds: a line per table,
    the six with the highest lag when there are more; a gap where a table did not apply changes
    (copying, paused, errored) or no sample was taken (a server down)."""
    tables: dict[str, float] = {}
    for _, lags in samples:
        for table, lag in lags.items():
            tables[table] = max(tables.get(table, 0.0), lag or 0.0)
    if len(samples) < 2 or not tables:
        return '<div id="lag-chart" class="sub">lag, last hour: collecting… (a sample every 30 s)</div>'
    shown = sorted(tables, key=lambda t: (-tables[t], t))[:len(_COLOURS)]
    top = max(max(tables[t] for t in shown), 1.0)
    left, bottom = 56, 18
    plot_w, plot_h = width - left - 8, height - bottom - 6

    def point(at: float, lag: float) -> str:
        x = left + max(0.0, (at - (now - window)) / window) * plot_w
        return f"{x:.1f},{6 + plot_h - lag / top * plot_h:.1f}"

    lines, legend = [], []
    for colour, table in zip(_COLOURS, shown, strict=False):
        runs: list[list[str]] = [[]]
        for at, lags in samples:
            lag = lags.get(table)
            if lag is None:
                runs.append([])
            else:
                runs[-1].append(point(at, lag))
        for run in runs:
            if len(run) == 1:
                x, y = run[0].split(",")
                lines.append(f'<circle cx="{x}" cy="{y}" r="1.5" fill="{colour}"/>')
            elif run:
                lines.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(run)}"/>')
        legend.append(f'<span style="color:{colour}">■</span> {escape(table)} (max {_lag_text(tables[table])})')
    axis = (f'<line x1="{left}" y1="{6 + plot_h}" x2="{width - 8}" y2="{6 + plot_h}" stroke="#b8bfcc"/>'
            f'<line x1="{left}" y1="6" x2="{left}" y2="{6 + plot_h}" stroke="#b8bfcc"/>'
            f'<text x="{left - 4}" y="14" text-anchor="end">{_lag_text(top)}</text>'
            f'<text x="{left - 4}" y="{6 + plot_h}" text-anchor="end">0</text>'
            f'<text x="{left}" y="{height - 3}">−{window / 60:.0f} min</text>'
            f'<text x="{width - 8}" y="{height - 3}" text-anchor="end">now</text>')
    more = f" · {len(tables) - len(shown)} more not shown" if len(tables) > len(shown) else ""
    return (f'<div id="lag-chart"><div class="sub">lag, last hour{more}</div>'
            f'<svg width="{width}" height="{height}" role="img" aria-label="lag of each table over the last hour"'
            f' font-size="11" fill="#5b6475">{axis}{"".join(lines)}</svg>'
            f'<div class="sub legend">{" · ".join(legend)}</div></div>')


def _row(t: dict[str, Any], history: list[float]) -> str:
    name = escape(t["table"])
    js_name = escape(json.dumps(t["table"]))  # a JS string literal for any name, then HTML-escaped
    if t["state"] == "PAUSED" or t.get("waits_for_operator"):
        actions = f'<button onclick="tableAct({js_name}, \'resume\')">Resume</button>'
    else:
        actions = f'<button onclick="tableAct({js_name}, \'pause\')">Pause</button>'
    actions += f'<button onclick="tableAct({js_name}, \'resync\')">Resync</button>'
    lag_s = "–" if t.get("lag_seconds") is None else f"{t['lag_seconds']:.1f} s"
    rate = "–" if t.get("changes_per_s") is None else f"{t['changes_per_s']:.1f}/s"
    error = escape(t["error"] or "")
    if t["state"] == "ERRORED":
        error += f'<br><span class="sub">{escape(error_summary(t))}</span>'
    if t.get("values_changed"):  # values.infinity: clamp changed some values
        changed = ", ".join(f"{k}={n}" for k, n in sorted(t["values_changed"].items()))
        error += f'<br><span class="sub">values changed: {escape(changed)}</span>'
    return (f'<tr data-table="{name}"><td>{name}</td><td><span class="st {escape(t["state"])}">'
            f'{escape(t["state"])}</span></td><td class="n">{_fmt_bytes(t["lag_bytes"])}</td>'
            f'<td class="n">{lag_s}</td><td class="n">{t["pending_changes"]}</td>'
            f'<td class="n">{t["rows_copied"]}</td><td class="n">{t["rows_applied"]}</td>'
            f'<td class="n">{rate}</td><td>{_sparkline(history)}</td>'
            f'<td class="err">{error}</td><td>{actions}</td></tr>')


def _wal_warning(status: dict[str, Any]) -> str:
    """The WAL guard's warning (slot over source.max_retained_wal, or lost), when there is one."""
    warning = (status.get("wal") or {}).get("wal_warning")
    return f'<div id="wal-warning" class="err">{escape(warning)}</div>' if warning else ""


def _copy_lock_warning(status: dict[str, Any]) -> str:
    """Source sessions waiting for a lock the initial copy holds (a DDL, and the writes behind it)."""
    lines = [copy_blocks_sentence(w, status.get("copy_gives_way_after_seconds"))
             for w in status.get("copy_lock_waiters") or []]
    return "".join(f'<div class="err copy-lock-waiter">{escape(line)}</div>' for line in lines)


def render_page(pipeline: MeteredRun, auth: bool) -> str:
    """The whole page for the pipeline as it is now."""
    status = pipeline.metrics.live_status()
    slot = status.get("slot") or {}
    capture = status["capture"]
    conn = ('<span class="ok">connected</span>' if capture["connected"]
            else f'<span class="bad">not connected</span> {escape(capture["last_error"] or "")}')
    paused = status["paused"]
    pipe_btn = (f'<button id="pipeline-{"resume" if paused else "pause"}" '
                f'onclick="act(\'POST\', \'/api/{"resume" if paused else "pause"}\')">'
                f'{"Resume pipeline" if paused else "Pause pipeline"}</button>')
    rows = "".join(_row(t, pipeline.metrics.history(t["table"])[-60:]) for t in status["tables"])
    if not rows:
        rows = '<tr><td colspan="11" class="sub">no tables yet</td></tr>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>headrace · {escape(status['pipeline'])}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>
<body>
<h1>headrace · {escape(status['pipeline'])}{' <span class="st PAUSED">PAUSED</span>' if paused else ''}</h1>
<div class="sub">target {escape(pipeline.config.target.kind)} · slot {escape(str(slot.get('name')))} ·
 captured {escape(str(status.get('captured_lsn')))} · current WAL {escape(str(status.get('current_wal_lsn')))}</div>
<div class="bar"><span>capture: {conn}</span><span>capture lag: {_fmt_bytes(slot.get('capture_lag_bytes'))}</span>
<span>slot retains: {_fmt_bytes(slot.get('retained_wal_bytes'))}</span>{pipe_btn}
<span><input id="add" placeholder="schema.table" size="18"><button id="add-btn" onclick="addTable()">Add table</button></span>
<a href="/metrics">metrics</a><a href="/openapi.json">API</a></div>
<div id="msg"></div>{_wal_warning(status)}{_copy_lock_warning(status)}
{lag_chart(pipeline.metrics.lag_history(), time.time())}
<table id="tables"><thead><tr><th>table</th><th>state</th><th>lag</th><th>lag (time)</th><th>pending</th>
<th>copied</th><th>applied</th><th>throughput (1 min)</th><th>last 5 min</th><th>last error</th><th></th></tr></thead>
<tbody>{rows}</tbody></table>
<script>{_JS % ('true' if auth else 'false')}</script>
</body></html>"""
