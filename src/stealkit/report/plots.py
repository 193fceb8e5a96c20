"""Figures as embedded PNG data URIs.

Figures are drawn on matplotlib ``Figure`` objects with the Agg canvas directly: no display is needed, pyplot's
global state is never touched and the process-wide backend is left alone (so notebooks keep theirs), and
matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

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
) -> str:
    """One line per series (with markers); optional labelled horizontal reference lines.

    Series whose names differ only by their metric (``accuracy, probs`` / ``fidelity, probs``) share a colour and
    differ by line style. With ``fit`` the y axis is fitted to the data and the reference lines, inside ``ylim``
    (e.g. ``(0, 1.02)`` for accuracies); without it, ``ylim`` is the axis.
    """
    fig, ax = _subplots(figsize=(8.0, 4.2))
    colours: dict[str, str] = {}
    for name, (xs, ys) in series.items():
        group, style = _group_and_style(name)
        colour = colours.setdefault(group, PALETTE[len(colours) % (len(PALETTE) - 1)])
        ax.plot(list(xs), list(ys), marker="o", ms=3.5, lw=1.7, ls=style, color=colour, label=name)
    for name, y in (hlines or {}).items():
        if y is None:
            continue
        ax.axhline(y, ls=(0, (4, 3)), lw=1, color="0.35")
        ax.annotate(name, xy=(0.01, y), xycoords=("axes fraction", "data"), va="bottom", fontsize=8, color="0.3")
    for name, x in (vlines or {}).items():
        ax.axvline(x, ls=(0, (1, 2)), lw=1.2, color="0.35")
        ax.annotate(name, xy=(x, 0.02), xycoords=("data", "axes fraction"), rotation=90, va="bottom", ha="right",
                    fontsize=8, color="0.3")
    if logx:
        ax.set_xscale("log")
        ticks = sorted({float(x) for xs, _ in series.values() for x in xs if float(x) > 0})
        if 0 < len(ticks) <= 12:  # label the measured points, in plain numbers, instead of 2x10^1 ...
            ax.set_xticks(ticks)
            from matplotlib.ticker import FuncFormatter, NullLocator

            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    values = [y for _, ys in series.values() for y in ys] + [y for y in (hlines or {}).values() if y is not None]
    limits = fitted_range(values, ylim) if fit else ylim
    if limits is not None:
        ax.set_ylim(*limits)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=8, frameon=False, loc="best")
    return figure_to_data_uri(fig)


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
