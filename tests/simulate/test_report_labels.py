"""The report's figures say their numbers in plain words: no raw mathtext on the log
axis (`$\\mathdefault{10^{0}}$`, what text.parse_math = False prints), and seconds on
the time axes carry their minute (22:13:19.5, never a bare 00.5)."""

from __future__ import annotations

import re

import matplotlib.text
from simlog import T0, combined, config, write

from netlimit.config.validate import load_file
from netlimit.simulate import report
from netlimit.simulate.run import replay

RULES = """\
  actions: [[remote_address]]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 5}
"""
CLOCK = re.compile(r"^(\d\d:\d\d(:\d\d(\.\d+)?)?|\d\d|[A-Z][a-z]{2}|\d{4})$")


def texts(fig) -> list[str]:
    fig.canvas.draw()
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text()]


def test_every_figure_has_plain_labels(tmp_path):
    lines = []
    for i in range(40):  # ten seconds: a burst of a client, sub-second buckets on the offender plot
        lines += [combined("203.0.113.9", T0 + i * 0.25)] * 3
    for c in range(200):
        lines.append(combined(f"10.0.0.{c}", T0 + c % 10))
    lines.sort(key=lambda ln: ln[ln.index("[") :])
    cfg = config(tmp_path / "rules.yaml", RULES)
    res = replay(load_file(cfg), [str(write(tmp_path / "a.log", lines))], progress=False, jobs=1)
    (r,) = res.rules
    figs = {
        "cdf": report.figure_cdf(r),
        "timeline": report.figure_timeline(r),
        "algorithms": report.figure_algorithms(r),
        "offenders": report.figure_offenders(r),
    }
    assert figs["offenders"] is not None
    for name, fig in figs.items():
        words = texts(fig)
        assert words, name
        assert not [w for w in words if "mathdefault" in w or re.search(r"\$.*\$", w)], (name, words)
    cdf_ticks = [t.get_text() for t in figs["cdf"].axes[0].get_xticklabels() if t.get_text()]
    assert cdf_ticks and all(re.fullmatch(r"[\d,.]+", t) for t in cdf_ticks), cdf_ticks
    assert "1" in cdf_ticks and "10" in cdf_ticks
    for name in ("timeline", "offenders"):
        ax = figs[name].axes[-1]
        ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert ticks and all(CLOCK.fullmatch(t) for t in ticks), (name, ticks)
        assert not [t for t in ticks if re.fullmatch(r"\d\d\.\d", t)], (name, ticks)  # a bare 00.5
    for fig in figs.values():
        report._pyplot().close(fig)
