"""Figures as embedded PNG data URIs.

Figures are drawn on matplotlib ``Figure`` objects with the Agg canvas directly: no display is needed, pyplot's
global state is never touched and the process-wide backend is left alone (so notebooks keep theirs), and
matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import base64
import functools
import io
import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]


def _subplots(nrows: int = 1, ncols: int = 1, **kw: Any) -> tuple[MplFigure, Any]:
    """``plt.subplots`` without pyplot: a figure on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kw)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=True)
    return fig, axes


def figure_to_data_uri(fig: MplFigure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


#: Okabe & Ito's colour-blind-safe palette (black last: it is kept for references)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
#: metrics drawn in a dashed or dotted line, so a series' metric reads from its style and its group from its colour
_METRIC_STYLES = {"fidelity": "--", "agreement": "--", "loss": ":", "l1": "--"}
_METRICS = ("accuracy", "fidelity", "agreement", "loss", "success", "asr")


def _group_and_style(name: str) -> tuple[str, str]:
    """``"fidelity, labels only"`` -> group ``"labels only"``, dashed; ``"student accuracy"`` -> ``"student"``."""
    words = [w.strip(" ,;:()") for w in name.replace(",", " ").split()]
    metric = next((w for w in words if w.lower() in _METRICS), None)
    group = " ".join(w for w in words if w and w.lower() not in _METRICS) or name
    return group, _METRIC_STYLES.get((metric or "").lower(), "-")


Dash = Literal["solid", "dashed", "dotted", "dashdot"]


@dataclass(frozen=True)
class SeriesStyle:
    """How :func:`line_plot` draws one series: series with the same ``colour`` key share a palette colour (keys get
    colours in the order they first appear), ``dash`` is the line style and ``marker`` a matplotlib marker."""

    colour: str
    dash: Dash = "solid"
    marker: str = "o"


#: the x tick labels' font size (points) and the width of one of their characters (DejaVu Sans' digits advance
#: 0.636 em; commas and points are narrower, so this overestimates a label a little)
TICK_PT = 9.0
CHAR_EM = 0.64


def label_width(text: str, font_pt: float = TICK_PT) -> float:
    """A tick label's rendered width in points, from its characters and the font size."""
    return len(text) * CHAR_EM * font_pt


def plain_number(v: float) -> str:
    """``4000.0`` -> ``"4,000"``; ``0.5`` -> ``"0.5"``."""
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.3g}"


def _roundness(v: float) -> tuple[int, int]:
    """Rank for keeping a tick: powers of ten first, then 1-2-5 values, then the rest (fewest digits first)."""
    mantissa = v / 10 ** math.floor(math.log10(v))
    m = round(mantissa, 6)
    return (0 if m == 1 else 1 if m in (2, 5) else 2, len(f"{m:g}"))


def log_ticks(lo: float, hi: float, *, width_pt: float, font_pt: float = TICK_PT,
              points: Sequence[float] | None = None, fmt: Callable[[float], str] = plain_number,
              gap_em: float = 0.8) -> list[float]:
    """Ticks of a log axis from ``lo`` to ``hi`` drawn ``width_pt`` points wide whose labels never overlap.

    The candidates are the measured x values ``points`` when there are at most 12 of them (a reader reads the
    rungs of a ladder off the axis), else 1-2-5 per decade. They are kept by priority (the smallest and the
    largest measured value, then powers of ten, then 1-2-5 values) while each label, ``len(label) x CHAR_EM x font_pt`` wide and
    centred on its tick, stays ``gap_em`` ems clear of every label kept before it.
    """
    if not (0 < lo < hi):
        return []
    inside = sorted({float(v) for v in (points or ()) if lo <= float(v) <= hi and float(v) > 0})
    measured = bool(inside) and len(inside) <= 12
    if not measured:
        decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
        inside = [m * 10.0 ** e for e in decades for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
        if len(inside) < 2:  # less than a decade: every digit
            inside = [m * 10.0 ** e for e in decades for m in range(1, 10) if lo <= m * 10.0 ** e <= hi]
    if not inside:
        return []
    span = math.log10(hi) - math.log10(lo)

    def at(v: float) -> float:
        return width_pt * (math.log10(v) - math.log10(lo)) / span

    ends = list(dict.fromkeys([inside[0], inside[-1]])) if measured else []
    order = ends + sorted((v for v in inside if v not in ends), key=lambda v: (*_roundness(v), v))
    kept: list[float] = []
    for v in order:
        half = label_width(fmt(v), font_pt) / 2
        if all(abs(at(v) - at(k)) >= half + label_width(fmt(k), font_pt) / 2 + gap_em * font_pt for k in kept):
            kept.append(v)
    return sorted(kept)


def fitted_range(values: Sequence[float], bounds: tuple[float, float] | None, pad: float = 0.06
                 ) -> tuple[float, float] | None:
    """A y range fitted to the data (with a margin), kept inside ``bounds``; ``None`` when there is no data."""
    finite = [float(v) for v in values if v is not None and float(v) == float(v)]
    if not finite:
        return bounds
    lo, hi = min(finite), max(finite)
    span = max(hi - lo, 0.05 * max(abs(hi), 1e-9), 1e-9)
    lo, hi = lo - pad * span * 4, hi + pad * span
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return lo, hi


def line_plot(
    series: Series,
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = False,
    hlines: Mapping[str, float] | None = None,
    ylim: tuple[float, float] | None = None,
    fit: bool = True,
    vlines: Mapping[str, float] | None = None,
    styles: Mapping[str, SeriesStyle] | None = None,
) -> str:
    """One line per series (with markers); optional labelled horizontal reference lines.

    Series whose names differ only by their metric (``accuracy, probs`` / ``fidelity, probs``) share a colour and
    differ by line style; ``styles`` overrides that per series (its colour key, dash and marker). With ``fit`` the
    y axis is fitted to the data and the reference lines, inside ``ylim`` (e.g. ``(0, 1.02)`` for accuracies);
    without it, ``ylim`` is the axis. The legend sits right of the plotting area, never on the curves, and a log
    x axis gets ticks whose labels have room (:func:`log_ticks`).
    """
    return figure_to_data_uri(line_figure(series, xlabel=xlabel, ylabel=ylabel, title=title, logx=logx,
                                          hlines=hlines, ylim=ylim, fit=fit, vlines=vlines, styles=styles))


def line_figure(
    series: Series,
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = False,
    hlines: Mapping[str, float] | None = None,
    ylim: tuple[float, float] | None = None,
    fit: bool = True,
    vlines: Mapping[str, float] | None = None,
    styles: Mapping[str, SeriesStyle] | None = None,
) -> MplFigure:
    """:func:`line_plot`'s figure, before it is saved."""
    fig, ax = _subplots(figsize=(8.0, 4.2))
    colours: dict[tuple[str, str], str] = {}
    for name, (xs, ys) in series.items():
        style = (styles or {}).get(name)
        if style is not None:
            key, dash, marker = ("style", style.colour), style.dash, style.marker
        else:
            group, dash = _group_and_style(name)
            key, marker = ("group", group), "o"
        colour = colours.setdefault(key, PALETTE[len(colours) % (len(PALETTE) - 1)])
        ax.plot(list(xs), list(ys), marker=marker, ms=4 if marker != "o" else 3.5, lw=1.7, ls=dash, color=colour,
                label=textwrap.fill(name, 40))
    for name, y in (hlines or {}).items():
        if y is None:
            continue
        ax.axhline(y, ls=(0, (4, 3)), lw=1, color="0.35")
        ax.annotate(name, xy=(0.01, y), xycoords=("axes fraction", "data"), va="bottom", fontsize=8, color="0.3")
    for name, x in (vlines or {}).items():
        ax.axvline(x, ls=(0, (1, 2)), lw=1.2, color="0.35")
        ax.annotate(name, xy=(x, 0.02), xycoords=("data", "axes fraction"), rotation=90, va="bottom", ha="right",
                    fontsize=8, color="0.3")
    ax.tick_params(axis="x", labelsize=TICK_PT)
    if logx:
        ax.set_xscale("log")
        points = sorted({float(x) for xs, _ in series.values() for x in xs if float(x) > 0})
        ax.xaxis.set_major_locator(_roomy_log_locator()(points))
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.xaxis.set_minor_formatter(NullFormatter())  # minor ticks are marks, never labels
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: plain_number(v)))
    values = [y for _, ys in series.values() for y in ys] + [y for y in (hlines or {}).values() if y is not None]
    limits = fitted_range(values, ylim) if fit else ylim
    if limits is not None:
        ax.set_ylim(*limits)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if series:  # outside the plotting area, right of it: the saved image's tight box takes it in
        ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, handlelength=3.2,
                  ncol=2 if len(series) > 18 else 1)
    return fig


@functools.cache
def _roomy_log_locator() -> type:
    """The locator class, made once, when a figure is drawn (matplotlib is imported only then)."""
    from matplotlib.ticker import Locator

    class RoomyLogLocator(Locator):
        """Major ticks of a log axis from :func:`log_ticks` at the axis' drawn width, read when it is drawn."""

        def __init__(self, points: Sequence[float]) -> None:
            self.points = list(points)

        def __call__(self) -> list[float]:
            lo, hi = sorted(self.axis.get_view_interval())
            return self.tick_values(lo, hi)

        def tick_values(self, vmin: float, vmax: float) -> list[float]:
            axes = self.axis.axes
            width_pt = axes.bbox.width * 72.0 / axes.figure.dpi
            return log_ticks(vmin, vmax, width_pt=width_pt, points=self.points)

    return RoomyLogLocator


def image_grid(images: Any, *, ncols: int = 10, title: str = "") -> str:
    """A grid of images ``[N, C, H, W]`` in [0, 1] (generator samples, adversarial examples)."""
    import numpy as np

    images = np.asarray(images, dtype=np.float32)
    n = images.shape[0]
    ncols = max(1, min(ncols, n))
    nrows = max(1, -(-n // ncols))
    fig, axes = _subplots(nrows, ncols, figsize=(ncols * 0.8, nrows * 0.8 + (0.3 if title else 0)))
    for i, ax in enumerate(np.atleast_1d(axes).ravel()):
        ax.axis("off")
        if i < n:
            img = images[i]
            if img.shape[0] == 1:
                ax.imshow(img[0], cmap="gray", vmin=0, vmax=1)
            else:
                ax.imshow(np.clip(img.transpose(1, 2, 0), 0, 1))
    if title:
        fig.suptitle(title, fontsize=10)
    return figure_to_data_uri(fig)
