"""The report's line plots read at a glance: the legend outside the curves, tick labels that never overlap,
a typed per-series style (colour key, dash, marker), and the audit's fidelity plot styled by answer kind and
attacker."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from stealkit.report.plots import (
    CHAR_EM,
    TICK_PT,
    SeriesStyle,
    label_width,
    line_figure,
    log_ticks,
    plain_number,
)

LADDER = [20, 50, 100, 200, 500, 1000, 2000, 4000, 5000]


def _axes_width_pt(**kw) -> float:
    """The width of line_plot's plotting area in points, as it is drawn."""
    fig = line_figure({"a": ([1, 10], [0, 1])}, xlabel="x", ylabel="y", logx=True, **kw)
    ax = fig.axes[0]
    return ax.bbox.width * 72.0 / fig.dpi


def _assert_room(ticks, lo, hi, width_pt):
    """No two labels, ``len(label) x CHAR_EM x TICK_PT`` wide and centred on their ticks, overlap."""
    at = [width_pt * (math.log10(t) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) for t in ticks]
    for (a, x), (b, y) in zip(zip(ticks, at, strict=True), list(zip(ticks, at, strict=True))[1:], strict=False):
        room = y - x
        need = (len(plain_number(a)) + len(plain_number(b))) * CHAR_EM * TICK_PT / 2
        assert room >= need, f"labels {plain_number(a)} and {plain_number(b)} overlap: {room:.1f} < {need:.1f} pt"


@pytest.mark.parametrize("lo, hi", [(20, 5000), (50, 4000), (14, 6000), (1, 1e6), (45, 5500), (3, 4)])
@pytest.mark.parametrize("points", [None, LADDER, [50, 100, 200, 2000], [40, 50, 60, 70, 80, 4000, 4500, 5000]])
def test_log_tick_labels_never_overlap_at_the_plots_width(lo, hi, points):
    width = _axes_width_pt()
    assert 400 < width < 500  # 8 inches, less the margins
    ticks = log_ticks(lo, hi, width_pt=width, points=points)
    assert ticks == sorted(ticks) and all(lo <= t <= hi for t in ticks)
    assert len(ticks) >= 2
    _assert_room(ticks, lo, hi, width)
    inside = [p for p in points or () if lo <= p <= hi]
    if inside:  # the ladder's ends are always labelled
        assert ticks[0] == min(inside) and ticks[-1] == max(inside)


def test_log_ticks_prefer_round_values_and_thin_out_on_a_narrow_axis():
    wide = log_ticks(20, 5000, width_pt=446)
    assert wide == [20, 50, 100, 200, 500, 1000, 2000, 5000]
    narrow = log_ticks(20, 5000, width_pt=120)
    assert 100 in narrow and 1000 in narrow and len(narrow) < len(wide)
    _assert_room(narrow, 20, 5000, 120)
    # the measured 4,000 and 5,000 sit 0.1 decade apart: one label, the ladder's top
    ticks = log_ticks(50, 5000, width_pt=446, points=LADDER)
    assert 5000 in ticks and 4000 not in ticks
    assert label_width("4,000") == pytest.approx(5 * CHAR_EM * TICK_PT)


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("xs", [LADDER, [50, 100, 200, 500, 1000, 2000, 3000, 4000], list(range(20, 5001, 250))])
def test_drawn_tick_labels_do_not_overlap(xs):
    fig = line_figure({"a": (xs, [i / len(xs) for i in range(len(xs))])}, xlabel="queries", ylabel="fidelity",
                      logx=True)
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t for t in ax.get_xticklabels() + ax.get_xticklabels(minor=True) if t.get_visible() and t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert len(boxes) >= 2
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not _overlaps(a, b), [t.get_text() for t in labels]


def test_the_legend_is_outside_the_plotting_area():
    series = {f"series {i}": ([10, 100, 1000], [0.1 * i, 0.5, 0.9]) for i in range(11)}
    fig = line_figure(series, xlabel="q", ylabel="f", logx=True, hlines={"90 %": 0.9})
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.bbox.x1  # right of the axes: never on a curve
    assert len(ax.get_legend().get_texts()) == 11


def test_a_style_mapping_sets_colour_key_dash_and_marker():
    series = {"probs like": ([1, 2], [0, 1]), "probs unrelated": ([1, 2], [0, 1]), "label like": ([1, 2], [0, 1]),
              "label like through noise": ([1, 2], [0, 1]), "other": ([1, 2], [0, 1])}
    styles = {"probs like": SeriesStyle("probs"), "probs unrelated": SeriesStyle("probs", "dashed"),
              "label like": SeriesStyle("label", "solid"),
              "label like through noise": SeriesStyle("label", "dashdot", "s")}
    fig = line_figure(series, xlabel="x", ylabel="y", styles=styles)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")}
    assert lines["probs like"].get_color() == lines["probs unrelated"].get_color()
    assert lines["label like"].get_color() == lines["label like through noise"].get_color()
    assert lines["probs like"].get_color() != lines["label like"].get_color()
    assert lines["probs like"].get_linestyle() == "-" and lines["probs unrelated"].get_linestyle() == "--"
    assert lines["label like through noise"].get_linestyle() == "-." and lines["label like through noise"].get_marker() == "s"
    assert lines["other"].get_marker() == "o"  # unstyled series keep the default
    assert len({ln.get_color() for ln in lines.values()}) == 3


def test_without_styles_a_series_metric_sets_its_line_style():
    fig = line_figure({"accuracy, probs": ([1, 2], [0, 1]), "fidelity, probs": ([1, 2], [0, 1])}, xlabel="x",
                      ylabel="y")
    a, f = [ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]
    assert a.get_color() == f.get_color() and a.get_linestyle() == "-" and f.get_linestyle() == "--"


def _part(answers, attacker, budget, fidelity, defence=""):
    return {"part": {"answers": answers, "attacker": attacker, "budget": budget, "defence": defence,
                     "kind": "extract", "seed_offset": 0},
            "id": f"extract-{answers}-{attacker}-{budget}{defence}", "total_queries": budget, "fidelity": fidelity}


def test_the_audits_fidelity_plot_is_coloured_by_answers_and_dashed_by_attacker(monkeypatch):
    from stealkit.audit import copies
    from stealkit.report import plots

    calls = []
    monkeypatch.setattr(plots, "line_plot", lambda series, **kw: calls.append((series, kw)) or "data:,")
    parts = [_part(a, att, b, 0.5 + b / 1000) for a in ("probs", "label", "topk") for att in ("unrelated", "like")
             for b in (50, 100, 200)]
    parts += [_part("label", "data-free", 2000, 0.78), _part("probs", "like", 50, 0.55, "noise:sigma=0.05"),
              _part("probs", "like", 100, 0.6, "noise:sigma=0.05"), _part("label", "like", 50, 0.8, "noise:sigma=0.05"),
              _part("probs", "like", 50, 0.8, "round:decimals=2")]
    kinds = {"extract": SimpleNamespace(makes_copy=True)}
    copies.sections({"parts": parts, "headline": []}, kinds)
    (series, kw), = calls
    styles = kw["styles"]
    assert list(series) == [  # the legend's order: answer kind, undefended first, then attacker
        "label like", "label unrelated", "label data-free", "label like through noise:sigma=0.05",
        "topk like", "topk unrelated", "probs like", "probs unrelated", "probs like through noise:sigma=0.05",
        "probs like through round:decimals=2"]
    assert set(styles) == set(series)
    assert {styles[n].colour for n in series if n.startswith("probs")} == {"probs"}
    assert styles["label like through noise:sigma=0.05"].colour == "label"  # the argmax attacker of a defence
    assert styles["probs like"].dash == "solid" and styles["probs unrelated"].dash == "dashed"
    assert styles["label data-free"].dash == "dotted"
    noise, rounding = styles["probs like through noise:sigma=0.05"], styles["probs like through round:decimals=2"]
    assert noise.dash == rounding.dash == "dashdot" and noise.marker != rounding.marker != "o"
    assert styles["label like through noise:sigma=0.05"].marker == noise.marker  # one marker per defence
    assert series["probs like through noise:sigma=0.05"] == ([50, 100], [0.55, 0.6])
