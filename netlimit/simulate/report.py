"""What a replay found, three ways: JSON (:func:`to_json`), a terminal summary
(:func:`print_summary`, rich tables) and one self-contained HTML page with plots
(:func:`write_html`; matplotlib with the Agg backend, imported only there, its
figures embedded as PNG data so the page needs no network)."""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
from pathlib import Path
from typing import Any

from .results import RuleResult, SimResult, Timeline

#: offenders drawn per rule
DRAWN_OFFENDERS = 5


def shown(text: str, limit: int = 80) -> str:
    """A client key or a name as text safe to print or draw: control characters
    escaped (keys come from requests: a header value may hold anything), bounded."""
    if not text.isprintable():
        text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _per(r: RuleResult) -> str:
    return {"second": "s", "minute": "min", "hour": "h", "day": "day"}.get(r.unit, r.unit)


def _pct(n: int, d: int) -> float:
    return round(100.0 * n / d, 3) if d else 0.0


def _timeline_json(tl: Timeline | None) -> dict[str, Any] | None:
    if tl is None:
        return None
    return {"start": tl.start, "width": tl.width, "admitted": tl.admitted, "denied": tl.denied}


def to_json(res: SimResult) -> dict[str, Any]:
    """The figures as plain data (``netlimit simulate --json``)."""
    rules = []
    for r in res.rules:
        rules.append(
            {
                "name": r.name,
                "path": r.path,
                "keys": list(r.keys),
                "limit": None
                if r.unlimited
                else {
                    "requests_per_unit": r.requests_per_unit,
                    "unit": r.unit,
                    "period": r.period,
                    "algorithm": r.algorithm,
                    "burst": r.burst,
                },
                "shadow_mode": r.shadow,
                "unlimited": r.unlimited,
                "requests": r.requests,
                "denied": r.denied,
                "denied_pct": _pct(r.denied, r.requests),
                "delayed": r.delayed,
                "clients": r.clients,
                "clients_denied": r.clients_denied,
                "untracked_requests": r.untracked,
                "peak": dict(r.peaks),
                "peak_counts": [list(p) for p in r.peak_counts],
                "top_denied": [
                    {"client": c.key, "requests": c.requests, "denied": c.denied, "peak": c.peak} for c in r.top
                ],
                "algorithms": [
                    {
                        "algorithm": a.algorithm,
                        "configured": a.configured,
                        "burst": a.burst,
                        "denied": a.denied,
                        "denied_pct": _pct(a.denied, r.requests),
                        "clients_denied": a.clients_denied,
                        "clients_denied_within_limit": a.within_denied,
                    }
                    for a in r.compare
                ],
                "timeline": _timeline_json(r.timeline),
                "offenders": [{"client": o.client.key, "timeline": _timeline_json(o.timeline)} for o in r.offenders],
            }
        )
    return {
        "config": res.config,
        "files": res.files,
        "formats": res.formats,
        "lines": res.lines,
        "requests": res.requests,
        "unreadable": res.unreadable,
        "unreadable_examples": [
            {"file": e.file, "line": e.line, "reason": e.reason, "text": e.text} for e in res.examples
        ],
        "first": _iso(res.first),
        "last": _iso(res.last),
        "denied": res.denied,
        "denied_pct": _pct(res.denied, res.requests),
        "unmatched": res.unmatched,
        "evictions": res.evictions,
        "warnings": res.warnings,
        "seconds": round(res.seconds, 3),
        "rules": rules,
    }


# --------------------------------------------------------------------------- terminal


def _span(res: SimResult) -> str:
    if res.first is None or res.last is None:
        return "no request"
    secs = res.last - res.first
    if secs >= 2 * 86400:
        d = f"{secs / 86400:.1f} days"
    elif secs >= 2 * 3600:
        d = f"{secs / 3600:.1f} hours"
    elif secs >= 120:
        d = f"{secs / 60:.1f} minutes"
    else:
        d = f"{secs:.0f} s"
    return f"{_iso(res.first)} .. {_iso(res.last)} ({d})"


def unreadable_lines(res: SimResult) -> list[str]:
    """The 'N lines could not be read' block (stderr)."""
    if not res.unreadable:
        return []
    out = [f"{res.unreadable} line{'s' if res.unreadable != 1 else ''} could not be read (not counted):"]
    out += [f"  {e}" for e in res.examples]
    if res.unreadable > len(res.examples):
        out.append(f"  ... and {res.unreadable - len(res.examples)} more")
    return out


def print_summary(res: SimResult, console: Any) -> None:
    """The rich tables of ``netlimit simulate``."""
    from rich.markup import escape
    from rich.table import Table

    files = ", ".join(f"{f} ({fmt})" for f, fmt in zip(res.files, res.formats))
    console.print(f"[bold]{escape(shown(res.config, 200))}[/] replayed over {escape(shown(files, 400))}")
    console.print(
        f"{res.lines:,} lines, {res.requests:,} requests, {_span(res)}; "
        f"[bold]{res.denied:,}[/] denied ({_pct(res.denied, res.requests):g}%), "
        f"{res.unmatched:,} matched no rule; {res.seconds:.1f} s"
    )
    t = Table(title="Per rule", title_justify="left")
    t.add_column("rule")
    t.add_column("limit")
    for col in ("requests", "denied", "clients", "denied clients", "peak p50 / p90 / p99 / p99.9 / max"):
        t.add_column(col, justify="right")
    for r in res.rules:
        limit = "unlimited" if r.unlimited else r.description + (" [shadow]" if r.shadow else "")
        peaks = " / ".join(str(r.peaks.get(k, "-")) for k in ("p50", "p90", "p99", "p99.9", "max"))
        t.add_row(
            escape(shown(r.name)),
            escape(limit),
            f"{r.requests:,}",
            f"{r.denied:,} ({r.denied_pct:.2f}%)",
            f"{r.clients:,}",
            f"{r.clients_denied:,}",
            f"{peaks} per {_per(r)}" if r.peaks else "-",
        )
    console.print(t)
    for r in res.rules:
        if r.unlimited or not r.requests:
            continue
        name = escape(shown(r.name))
        a = Table(title=f"{name}: the same limit under each algorithm", title_justify="left")
        a.add_column("algorithm")
        for col in ("denied", "denied clients", "of them never over the limit"):
            a.add_column(col, justify="right")
        for c in r.compare:
            alg = c.algorithm + (f" (burst {c.burst})" if c.burst else "") + (" ← configured" if c.configured else "")
            a.add_row(
                alg,
                f"{c.denied:,} ({_pct(c.denied, r.requests):.2f}%)",
                f"{c.clients_denied:,}",
                f"{c.within_denied:,}",
            )
        console.print(a)
        if r.top:
            o = Table(title=f"{name}: most denied clients", title_justify="left")
            o.add_column(escape(", ".join(r.keys)))
            for col in ("requests", "denied", f"peak per {_per(r)}"):
                o.add_column(col, justify="right")
            for cl in r.top:
                o.add_row(escape(shown(cl.key)), f"{cl.requests:,}", f"{cl.denied:,}", f"{cl.peak:,}")
            console.print(o)
        if r.untracked:
            console.print(
                f"[yellow]{name}: {r.untracked:,} requests of clients beyond --max-clients are counted but "
                "not in the per-client figures[/]"
            )


# --------------------------------------------------------------------------- HTML


def _pyplot() -> Any:
    """matplotlib's pyplot, drawing off screen (Agg), with text drawn as written
    (names and client keys: a "$" starts no formula)."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    _pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


#: ConciseDateFormatter's tick formats (years .. seconds): seconds carry their minute,
#: "22:13:19.5" rather than a bare "19.5" or "00.5"
DATE_FORMATS = ["%Y", "%b", "%d", "%H:%M", "%H:%M", "%H:%M:%S.%f"]


def _date_axis(axis: Any) -> None:
    """Date ticks a person reads at a glance (the day and time of the offset beside)."""
    import matplotlib.dates as mdates

    axis.set_major_formatter(mdates.ConciseDateFormatter(axis.get_major_locator(), formats=DATE_FORMATS))


def _log_axis(axis: Any) -> None:
    """Plain numbers on a log axis (1, 10, 100, 1,000): the default labels are mathtext
    (`$\\mathdefault{10^{0}}$`), which text.parse_math = False would print raw."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _dates(tl: Timeline) -> list[float]:
    """The buckets' middles as matplotlib date numbers (days since the epoch, UTC)."""
    return [(tl.start + (i + 0.5) * tl.width) / 86400.0 for i in range(len(tl.admitted))]


def _width_label(w: float) -> str:
    if w >= 3600 and w % 3600 == 0:
        return f"{w / 3600:g} h"
    if w >= 60 and w % 60 == 0:
        return f"{w / 60:g} min"
    return f"{w:g} s"


def figure_cdf(r: RuleResult) -> Any:
    """Per-client peak rate as a CDF: log x axis, logit y axis (p50, p90, p99, p99.9
    evenly apart, so the tail where limits bite is visible), the limit drawn."""
    from matplotlib.ticker import NullLocator

    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(7, 3.8))
    total = sum(n for _, n in r.peak_counts)
    lo, hi = 0.5 / total, 1 - 0.5 / total  # a logit axis never reaches 0 or 1
    xs = [0.8]
    ys = [lo]
    acc = 0
    for v, n in r.peak_counts:
        acc += n
        xs.append(v)
        ys.append(min(max(acc / total, lo), hi))
    xmax = max(xs[-1], r.requests_per_unit or 1) * 2
    xs.append(xmax)
    ys.append(ys[-1])
    ax.step(xs, ys, where="post", color="#1f77b4", label=f"{total:,} clients")
    ax.set_xscale("log")
    ax.set_yscale("logit")
    _log_axis(ax.xaxis)
    if not r.unlimited:
        lim = r.requests_per_unit
        ax.axvline(max(lim, 0.8), color="#d62728", linestyle="--", label=f"limit {lim}/{_per(r)}")
        over = sum(n for v, n in r.peak_counts if v > lim)
        ax.text(
            0.02,
            0.92,
            f"{over:,} client{'s' if over != 1 else ''} above the limit",
            transform=ax.transAxes,
            color="#d62728",
        )
    p999 = r.peaks.get("p99.9")
    if p999:
        ax.axvline(p999, color="#7f7f7f", linestyle=":", label=f"p99.9 = {p999}")
    ax.set_xlim(0.8, xmax)
    ax.set_ylim(lo, hi)
    ticks = [y for y in (0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999) if lo <= y <= hi]
    ax.set_yticks(ticks, [f"{100 * y:g}%" for y in ticks])
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(f"the client's peak: most requests in one {r.unit or 'period'} (log scale)")
    ax.set_ylabel("share of clients at or below")
    ax.set_title(f"{shown(r.name, 60)}: per-client peak rate")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def figure_timeline(r: RuleResult) -> Any:
    """Admitted and denied requests over time."""

    plt = _pyplot()

    tl = r.timeline
    assert tl is not None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    x = _dates(tl)
    ax.stackplot(x, tl.admitted, tl.denied, labels=["admitted", "denied"], colors=["#2ca02c", "#d62728"], step="mid")
    ax.xaxis_date(dt.UTC)
    ax.set_ylabel(f"requests per {_width_label(tl.width)}")
    ax.set_title(f"{shown(r.name, 60)}: admitted and denied over time (UTC)")
    _date_axis(ax.xaxis)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def figure_offenders(r: RuleResult) -> Any | None:
    """The most denied clients' requests over time, one row each."""

    plt = _pyplot()

    drawn = [o for o in r.offenders if o.timeline is not None][:DRAWN_OFFENDERS]
    if not drawn:
        return None
    fig, axes = plt.subplots(len(drawn), 1, figsize=(7, 1.2 + 1.3 * len(drawn)), sharex=True, squeeze=False)
    for ax, o in zip(axes[:, 0], drawn):
        tl = o.timeline
        assert tl is not None
        x = _dates(tl)
        ax.stackplot(x, tl.admitted, tl.denied, colors=["#2ca02c", "#d62728"], step="mid")
        ax.xaxis_date(dt.UTC)
        ax.set_ylabel(f"per {_width_label(tl.width)}", fontsize=8)
        ax.set_title(
            f"{shown(o.client.key, 60)}: {o.client.requests:,} requests, {o.client.denied:,} denied, "
            f"peak {o.client.peak:,}/{_per(r)}",
            fontsize=9,
            loc="left",
        )
        ax.grid(True, alpha=0.3)
    last = axes[-1, 0]
    _date_axis(last.xaxis)
    fig.suptitle(
        f"{shown(r.name, 60)}: top offenders (green admitted, red denied; from their first busy session)", fontsize=10
    )
    fig.tight_layout()
    return fig


def figure_algorithms(r: RuleResult) -> Any:
    """Denied requests and clients under each of the five algorithms at the same limit."""
    plt = _pyplot()

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 2.8), sharey=True)
    names = [c.algorithm + (" *" if c.configured else "") for c in r.compare]
    colors = ["#ff7f0e" if c.configured else "#1f77b4" for c in r.compare]
    y = list(range(len(names)))
    den = [_pct(c.denied, r.requests) for c in r.compare]
    a1.barh(y, den, color=colors)
    a1.set_yticks(y, names)
    a1.invert_yaxis()
    a1.set_xlabel("requests denied (%)")
    for i, c in enumerate(r.compare):
        a1.text(den[i], i, f" {c.denied:,}", va="center", fontsize=8)
    cl = [c.clients_denied for c in r.compare]
    a2.barh(y, cl, color=colors)
    a2.set_xlabel("clients ever denied")
    for i, v in enumerate(cl):
        a2.text(v, i, f" {v:,}", va="center", fontsize=8)
    for a in (a1, a2):
        a.set_xlim(0, (max(den if a is a1 else cl) or 1) * 1.3)
        a.grid(True, axis="x", alpha=0.3)
    fig.suptitle(
        f"{shown(r.name, 60)}: {r.requests_per_unit} per {r.unit} under each algorithm (* configured)", fontsize=10
    )
    fig.tight_layout()
    return fig


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.8em 0; } td, th { padding: 0.2em 0.7em; border: 1px solid #ddd; }
th { background: #f4f4f4; text-align: left; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #eee; }
.warn { color: #a15c00; } code { background: #f4f4f4; padding: 0 0.2em; }
"""


def _table(head: list[str], rows: list[list[Any]]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        cells = []
        for v in row:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                cells.append(f'<td class="n">{v:,}</td>' if isinstance(v, int) else f'<td class="n">{v:.2f}</td>')
            else:
                cells.append(f"<td>{html.escape(str(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _img(fig: Any, alt: str) -> str:
    return f'<figure><img src="data:image/png;base64,{_png(fig)}" alt="{html.escape(alt)}"></figure>'


def render_html(res: SimResult) -> str:
    """The report page (every plot embedded)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>netlimit simulate: {html.escape(res.config)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>netlimit simulate: <code>{html.escape(res.config)}</code></h1>",
        "<p>"
        + html.escape(
            f"{res.lines:,} lines of {', '.join(res.files)}; {res.requests:,} requests, {_span(res)}; "
            f"{res.denied:,} denied ({_pct(res.denied, res.requests):g}%); {res.unmatched:,} matched no rule."
        )
        + "</p>",
    ]
    for line in unreadable_lines(res) + res.warnings:
        parts.append(f'<p class="warn">{html.escape(line)}</p>')
    parts.append(
        _table(
            ["rule", "limit", "requests", "denied", "denied %", "clients", "denied clients", "peak p99.9", "peak max"],
            [
                [
                    r.name,
                    "unlimited" if r.unlimited else r.description + (" [shadow]" if r.shadow else ""),
                    r.requests,
                    r.denied,
                    r.denied_pct,
                    r.clients,
                    r.clients_denied,
                    r.peaks.get("p99.9", "-"),
                    r.peaks.get("max", "-"),
                ]
                for r in res.rules
            ],
        )
    )
    for r in res.rules:
        parts.append(f"<h2>{html.escape(r.name)} <small>({html.escape(r.description)})</small></h2>")
        if not r.requests:
            parts.append("<p>No request of the log matched this rule.</p>")
            continue
        parts.append(_img(figure_cdf(r), f"{r.name}: per-client peak rate CDF"))
        if r.timeline is not None:
            parts.append(_img(figure_timeline(r), f"{r.name}: admitted and denied over time"))
        if not r.unlimited:
            parts.append(_img(figure_algorithms(r), f"{r.name}: five algorithms compared"))
            parts.append(
                _table(
                    ["algorithm", "burst", "denied", "denied %", "denied clients", "of them never over the limit"],
                    [
                        [
                            c.algorithm + (" (configured)" if c.configured else ""),
                            c.burst if c.burst else "-",
                            c.denied,
                            _pct(c.denied, r.requests),
                            c.clients_denied,
                            c.within_denied,
                        ]
                        for c in r.compare
                    ],
                )
            )
        fo = figure_offenders(r)
        if fo is not None:
            parts.append(_img(fo, f"{r.name}: top offenders over time"))
        if r.top:
            parts.append(
                _table(
                    [", ".join(r.keys), "requests", "denied", f"peak per {r.unit}"],
                    [[c.key, c.requests, c.denied, c.peak] for c in r.top],
                )
            )
    parts.append("<p><small>Made by <code>netlimit simulate</code>. Times in UTC.</small></p></body></html>")
    return "\n".join(parts)


def write_html(res: SimResult, path: Path) -> None:
    text = render_html(res)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
