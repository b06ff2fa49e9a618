"""The operations page as HTML: rendered on the server from the job table's figures, every value escaped, the
plots drawn as inline SVG. One small script refreshes the running merges' phases and the counts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape
from urllib.parse import urlencode

from service.jobs import JobRecord, Status
from service.overview import Bucket, TableCounts

PAGE_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1d2433;background:#fafbfc}
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.1rem;margin:1.6rem 0 .5rem}
table{border-collapse:collapse;background:#fff;font-size:.9rem}
th,td{border:1px solid #d8dde6;padding:.3rem .6rem;text-align:left;vertical-align:top}
th{background:#eef1f5}td.n{text-align:right;font-variant-numeric:tabular-nums}
.who{color:#5b6578;font-size:.85rem}.muted{color:#5b6578}
.totals{display:flex;gap:.8rem;flex-wrap:wrap}
.total{background:#fff;border:1px solid #d8dde6;border-radius:6px;padding:.5rem .9rem;min-width:6rem}
.total b{display:block;font-size:1.4rem}
.status-failed{color:#b42318}.status-running{color:#175cd3}.status-succeeded{color:#067647}
.phase{font-family:ui-monospace,monospace}
form.inline{display:inline;margin:0}button{cursor:pointer}
.plots{display:flex;gap:1.5rem;flex-wrap:wrap}
svg text{font-size:11px;fill:#5b6578}
nav a{margin-right:.8rem}
"""

REFRESH_SECONDS = 2.0
"""How often the page asks for the running merges' phases and the counts."""

REFRESH_SCRIPT = """
(function(){
  function refresh(){
    fetch("/ui/live.json",{credentials:"same-origin",cache:"no-store"}).then(function(r){
      if(!r.ok){return null;}return r.json();
    }).then(function(live){
      if(!live){return;}
      Object.keys(live.counts).forEach(function(s){
        var el=document.getElementById("count-"+s);if(el){el.textContent=live.counts[s];}
      });
      live.running.forEach(function(job){
        var el=document.getElementById("phase-"+job.id);if(el){el.textContent=job.phase;}
      });
      var known=document.querySelectorAll("[data-running-job]");
      var ids=live.running.map(function(j){return j.id;});
      var stale=false;known.forEach(function(el){if(ids.indexOf(el.dataset.runningJob)<0){stale=true;}});
      if(ids.length!==known.length){stale=true;}
      var banner=document.getElementById("stale");if(banner){banner.hidden=!stale;}
    }).catch(function(){});
  }
  setInterval(refresh,%d);
})();
"""


@dataclass(frozen=True)
class Window:
    """A plotted time span: ``buckets`` slices of ``width`` each."""

    name: str
    width: timedelta
    buckets: int

    @property
    def span(self) -> timedelta:
        return self.width * self.buckets

    def start(self, now: datetime) -> datetime:
        """The window's first instant, slices aligned to ``width`` so a reload draws the same slices."""
        step = self.width.total_seconds()
        end = datetime.fromtimestamp((now.timestamp() // step + 1) * step, tz=now.tzinfo)
        return end - self.span


WINDOWS = {
    w.name: w
    for w in (
        Window("1h", timedelta(minutes=1), 60),
        Window("24h", timedelta(minutes=30), 48),
        Window("7d", timedelta(hours=3), 56),
    )
}
DEFAULT_WINDOW = "24h"


@dataclass(frozen=True)
class Overview:
    """Everything one page shows, read from the job table for one caller."""

    who: str
    signed_in: bool
    totals: dict[Status, int]
    tables: list[TableCounts]
    tables_next: str | None
    running: list[JobRecord]
    queued: list[JobRecord]
    failures: list[JobRecord]
    failures_next: str | None
    window: Window
    window_start: datetime
    buckets: list[Bucket]
    csrf: str
    nonce: str


def render_overview(view: Overview) -> str:
    body = "".join(
        (
            _header(view),
            _totals(view.totals),
            _plots(view),
            _running(view),
            _queued(view),
            _tables(view),
            _failures(view),
        )
    )
    script = REFRESH_SCRIPT % int(REFRESH_SECONDS * 1000)
    return _document("merge-service operations", body, nonce=view.nonce, script=script)


def render_login(message: str | None = None) -> str:
    note = f'<p class="status-failed" id="login-error">{escape(message)}</p>' if message else ""
    body = (
        "<h1>merge-service operations</h1>"
        f"<p>Sign in with an API token. The page shows that token's jobs (an admin token's: every job).</p>{note}"
        '<form method="post" action="/ui/login">'
        '<label>Token <input type="password" name="token" id="token" autocomplete="off" required></label> '
        '<button type="submit" id="sign-in">Sign in</button></form>'
    )
    return _document("Sign in: merge-service operations", body)


def _document(title: str, body: str, *, nonce: str | None = None, script: str | None = None) -> str:
    tail = f'<script nonce="{escape(nonce)}">{script}</script>' if nonce and script else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title><style>{PAGE_STYLE}</style></head>"
        f"<body>{body}{tail}</body></html>"
    )


def _header(view: Overview) -> str:
    logout = (
        '<form class="inline" method="post" action="/ui/logout"><button type="submit" id="sign-out">Sign out</button>'
        "</form>"
        if view.signed_in
        else ""
    )
    return (
        f'<h1>merge-service operations</h1><p class="who">{escape(view.who)} {logout}</p>'
        '<p id="stale" class="muted" hidden>Merges started or ended since this page loaded: '
        '<a href="">reload</a> to see them.</p>'
    )


def _totals(totals: dict[Status, int]) -> str:
    cells = "".join(
        f'<div class="total"><span class="status-{s.value}">{s.value}</span>'
        f'<b id="count-{s.value}">{totals[s]}</b></div>'
        for s in Status
    )
    return f'<h2>Jobs by status</h2><div class="totals">{cells}</div>'


def _when(value: datetime | None) -> str:
    return "" if value is None else escape(value.strftime("%Y-%m-%d %H:%M:%S"))


def _cancel(job: JobRecord, csrf: str) -> str:
    if job.finished:
        return ""
    if job.cancel_requested:
        return '<span class="muted">cancel requested</span>'
    return (
        f'<form class="inline" method="post" action="/ui/jobs/{escape(job.id)}/cancel">'
        f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
        f'<button type="submit" id="cancel-{escape(job.id)}">Cancel</button></form>'
    )


def _running(view: Overview) -> str:
    if not view.running:
        return '<h2>Running merges</h2><p class="muted" id="running-none">No merge is running.</p>'
    rows = "".join(
        f'<tr data-running-job="{escape(j.id)}"><td>{escape(j.id)}</td><td>{escape(j.target_key)}</td>'
        f'<td class="phase" id="phase-{escape(j.id)}">{escape(j.phase.value)}</td>'
        f'<td>{_when(j.started_at)}</td><td class="n">{j.attempts}</td><td>{_cancel(j, view.csrf)}</td></tr>'
        for j in view.running
    )
    return (
        '<h2>Running merges</h2><table id="running"><tr><th>job</th><th>table</th><th>phase</th><th>started (UTC)</th>'
        f"<th>attempts</th><th></th></tr>{rows}</table>"
    )


def _queued(view: Overview) -> str:
    if not view.queued:
        return ""
    more = view.totals[Status.QUEUED] - len(view.queued)
    rows = "".join(
        f"<tr><td>{escape(j.id)}</td><td>{escape(j.target_key)}</td><td>{_when(j.submitted_at)}</td>"
        f"<td>{_cancel(j, view.csrf)}</td></tr>"
        for j in view.queued
    )
    tail = f'<p class="muted">and {more} more queued.</p>' if more > 0 else ""
    return (
        '<h2>Next queued</h2><table id="queued"><tr><th>job</th><th>table</th><th>submitted (UTC)</th><th></th></tr>'
        f"{rows}</table>{tail}"
    )


def _reason(job: JobRecord) -> str:
    error = job.error or {}
    title = str(error.get("title") or "")
    detail = str(error.get("detail") or "")
    kind = str(error.get("type") or "").rsplit(":", 1)[-1]
    text = f"{title}: {detail}" if title and detail else title or detail or "no reason recorded"
    return f'{escape(text)} <span class="muted">({escape(kind)})</span>' if kind else escape(text)


def _failures(view: Overview) -> str:
    if not view.failures:
        return '<h2>Recent failures</h2><p class="muted" id="failures-none">No failed merge.</p>'
    rows = "".join(
        f"<tr><td>{escape(j.id)}</td><td>{escape(j.target_key)}</td><td>{_when(j.finished_at)}</td>"
        f'<td class="n">{j.attempts}</td><td>{_reason(j)}</td></tr>'
        for j in view.failures
    )
    more = (
        f'<p><a id="failures-next" href="{_link(view, failures_before=view.failures_next)}">Older failures</a></p>'
        if view.failures_next
        else ""
    )
    return (
        '<h2>Recent failures</h2><table id="failures"><tr><th>job</th><th>table</th><th>failed at (UTC)</th>'
        f"<th>attempts</th><th>reason</th></tr>{rows}</table>{more}"
    )


def _tables(view: Overview) -> str:
    head = "".join(f"<th>{s.value}</th>" for s in Status)
    rows = "".join(
        f'<tr data-table="{escape(t.target_key)}"><td>{escape(t.target_key)}</td>'
        + "".join(f'<td class="n" data-status="{s.value}">{t.counts[s]}</td>' for s in Status)
        + "</tr>"
        for t in view.tables
    )
    more = (
        f'<p><a id="tables-next" href="{_link(view, tables_after=view.tables_next)}">More tables</a></p>'
        if view.tables_next
        else ""
    )
    empty = '<p class="muted">No jobs yet.</p>' if not view.tables else ""
    return f'<h2>Jobs per table</h2>{empty}<table id="tables"><tr><th>table</th>{head}</tr>{rows}</table>{more}'


def _link(view: Overview, **params: str | None) -> str:
    query = {"window": view.window.name, **{k: v for k, v in params.items() if v is not None}}
    return escape("/ui?" + urlencode(query))


def _plots(view: Overview) -> str:
    choices = " ".join(
        f'<a href="/ui?window={name}">{"<b>" + name + "</b>" if name == view.window.name else name}</a>'
        for name in WINDOWS
    )
    start, end = view.window_start, view.window_start + view.window.span
    throughput = bar_chart(
        "plot-throughput",
        "Merges finished per " + _duration_text(view.window.width),
        [(b.succeeded, b.failed) for b in view.buckets],
        ("#12b76a", "#f04438"),
        start,
        end,
        unit="",
    )
    durations = bar_chart(
        "plot-duration",
        "Mean and longest duration of succeeded merges (seconds)",
        [(b.mean_seconds or 0.0, max(0.0, (b.max_seconds or 0.0) - (b.mean_seconds or 0.0))) for b in view.buckets],
        ("#2e90fa", "#b2ddff"),
        start,
        end,
        unit="s",
    )
    return (
        f"<h2>Over time (UTC)</h2><nav>window: {choices}</nav>"
        f'<div class="plots">{throughput}{durations}</div>'
        '<p class="muted">Green: succeeded, red: failed. Durations run from a job\'s first start to its end; '
        "the light part of a bar reaches the longest.</p>"
    )


def _duration_text(width: timedelta) -> str:
    minutes = int(width.total_seconds() // 60)
    return f"{minutes // 60} h" if minutes % 60 == 0 else f"{minutes} min"


def bar_chart(
    element_id: str,
    title: str,
    stacks: Sequence[tuple[float, float]],
    colours: tuple[str, str],
    start: datetime,
    end: datetime,
    *,
    unit: str,
) -> str:
    """Stacked bars, one per time slice, as inline SVG: the page needs no plotting library nor script."""
    width, height, left, bottom, top = 560, 170, 44, 20, 22
    plot_w, plot_h = width - left - 8, height - bottom - top
    peak = max((a + b for a, b in stacks), default=0.0) or 1.0
    step = plot_w / max(1, len(stacks))
    bars = []
    for i, (low, high) in enumerate(stacks):
        x = left + i * step
        low_h, high_h = plot_h * low / peak, plot_h * high / peak
        y_low = top + plot_h - low_h
        if low_h > 0:
            bars.append(
                f'<rect x="{x:.1f}" y="{y_low:.1f}" width="{max(step - 1, 1):.1f}" height="{low_h:.1f}" '
                f'fill="{colours[0]}"/>'
            )
        if high_h > 0:
            bars.append(
                f'<rect x="{x:.1f}" y="{y_low - high_h:.1f}" width="{max(step - 1, 1):.1f}" height="{high_h:.1f}" '
                f'fill="{colours[1]}"/>'
            )
    peak_label = f"{peak:.3g}{unit}" if any(a + b for a, b in stacks) else f"0{unit}"
    axis = (
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#98a2b3"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#98a2b3"/>'
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{escape(peak_label)}</text>'
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>'
        f'<text x="{left}" y="{height - 4}">{escape(start.strftime("%m-%d %H:%M"))}</text>'
        f'<text x="{left + plot_w}" y="{height - 4}" text-anchor="end">{escape(end.strftime("%m-%d %H:%M"))}</text>'
        f'<text x="{left}" y="14" style="font-weight:600;fill:#1d2433">{escape(title)}</text>'
    )
    return (
        f'<svg id="{escape(element_id)}" role="img" aria-label="{escape(title)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">{axis}{"".join(bars)}</svg>'
    )
