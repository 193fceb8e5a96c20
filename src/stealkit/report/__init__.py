"""Reports: self-contained HTML pages with embedded figures, built from a run directory."""

from stealkit.report.html import Figure, Html, Section, markup, render_report, render_table
from stealkit.report.plots import SeriesStyle, image_grid, line_plot

__all__ = ["Figure", "Html", "Section", "SeriesStyle", "markup", "image_grid", "line_plot", "render_report",
           "render_table"]
