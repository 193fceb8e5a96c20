"""Self-contained HTML reports: a summary at the top, sections with tables and embedded figures."""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stealkit import __version__

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1180px;margin:2rem auto;
padding:0 1rem;color:#1d232b;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;border-bottom:1px solid #dde3ea;padding-bottom:.2rem;
margin-top:2rem}
.meta{color:#5a6570;font-size:.85rem}.summary{background:#f4f7fa;border:1px solid #dde3ea;border-radius:6px;
padding:.6rem 1rem}.facts{display:grid;grid-template-columns:max-content 1fr;gap:.15rem 1rem;margin:0}
.facts dt{color:#5a6570}.facts dd{margin:0;font-weight:500}
.tablewrap{max-width:100%;overflow-x:auto;margin:.6rem 0}
table{border-collapse:collapse;font-size:.9rem}th,td{border:1px solid #dde3ea;padding:.25rem .6rem;
text-align:right;vertical-align:top;word-break:normal;overflow-wrap:normal;hyphens:none}
th{background:#f4f7fa;white-space:nowrap}td:first-child,th:first-child{text-align:left}
td{max-width:32rem}
figure{margin:.8rem 0}figure img{max-width:100%;height:auto}figcaption{font-size:.85rem;color:#5a6570}
nav a{margin-right:.8rem;font-size:.9rem}code{background:#f4f7fa;padding:0 .2rem;border-radius:3px}
details{margin:.6rem 0}pre{max-width:100%;overflow-x:auto;background:#f4f7fa;padding:.6rem;border-radius:6px}
"""


class Html(str):
    """Markup of stealkit's own: the one kind of string a page writes unescaped. Everything else (run names,
    settings, summaries, records, notes) is escaped when the page is rendered; build mixed text with
    :func:`markup`, which escapes what it interpolates."""


def markup(template: str, *args: Any) -> Html:
    """``markup("run <code>{}</code>", name)``: ``template`` is ours; every argument is escaped."""
    return Html(template.format(*(html.escape(str(a)) for a in args)))


def _paragraph(text: str) -> str:
    return text if isinstance(text, Html) else html.escape(text)


@dataclass
class Figure:
    uri: str
    caption: str = ""


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[tuple[str, Sequence[Mapping[str, Any]]]] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.title.lower()).strip("-")


def fmt(value: Any) -> str:
    """A value as a person reads it: 3 significant digits, thousands separators, no Python reprs."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return "–"
        if value == 0:
            return "0"
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) < 1e-3:
            return f"{value:.2e}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {fmt(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(fmt(v) for v in value)
    return str(value)


def render_table(rows: Sequence[Mapping[str, Any]], caption: str = "") -> str:
    if not rows:
        return ""
    cols: list[str] = []
    for row in rows:
        cols.extend(c for c in row if c not in cols)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(fmt(row.get(c)))}</td>" for c in cols) + "</tr>" for row in rows
    )
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<div class='tablewrap'><table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def flatten(config: Mapping[str, Any], prefix: str = "") -> list[dict[str, Any]]:
    """Nested settings as rows ``{"setting": "a.b", "value": ...}`` (lists of scalars stay one value)."""
    rows: list[dict[str, Any]] = []
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            rows.extend(flatten(v, key + "."))
        else:
            rows.append({"setting": key, "value": v})
    return rows


def render_report(title: str, summary: Mapping[str, Any], sections: Sequence[Section], *, config: Any = None,
                  facts: Mapping[str, Any] | None = None) -> str:
    """A standalone page: every figure is an embedded PNG, nothing is fetched.

    ``facts`` (what was attacked, through which access, the ledger against the budget, the headline) head the
    page; ``summary`` is the headline table; ``config`` (the run's ``config.json``) is shown as a table of
    settings with the raw file one click away.
    """
    nav = " ".join(f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for s in sections)
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='meta'>stealkit {html.escape(__version__)} · {time.strftime('%Y-%m-%d %H:%M:%S')}</p>",
    ]
    box = []
    if facts:
        box.append("<dl class='facts'>" + "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(fmt(v))}</dd>"
                                                  for k, v in facts.items()) + "</dl>")
    if summary:
        box.append(render_table([{k: v for k, v in summary.items()}]))
    if box:
        parts.append("<div class='summary'>" + "".join(box) + "</div>")
    if sections:
        parts.append(f"<nav>{nav}</nav>")
    for s in sections:
        parts.append(f"<h2 id='{s.anchor}'>{html.escape(s.title)}</h2>")
        parts.extend(f"<p>{_paragraph(p)}</p>" for p in s.paragraphs)  # only Html goes unescaped
        parts.extend(render_table(rows, cap) for cap, rows in s.tables)
        for fig in s.figures:
            cap = f"<figcaption>{html.escape(fig.caption)}</figcaption>" if fig.caption else ""
            parts.append(f"<figure><img src='{html.escape(fig.uri, quote=True)}' "
                         f"alt='{html.escape(fig.caption or s.title)}'>{cap}</figure>")
    if config is not None:
        import json

        parts.append("<h2 id='config'>Settings</h2>")
        settings = config.get("config") if isinstance(config, Mapping) else None
        if isinstance(settings, Mapping) and settings:
            parts.append(render_table(flatten(settings)))
        env = {k: config[k] for k in ("command", "seed", "stealkit_version", "git_commit", "torch", "threads",
                                      "load_average", "device") if isinstance(config, Mapping) and k in config}
        if isinstance(config, Mapping) and isinstance(config.get("created"), int | float):
            env["created"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(config["created"]))
        if env:
            parts.append(render_table([env], "run"))
        parts.append("<details><summary>raw config.json</summary>"
                     f"<pre>{html.escape(json.dumps(config, indent=2, default=str))}</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)
