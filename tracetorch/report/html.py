"""A self-contained HTML report of a profile: one file that works offline, in any browser.

The page embeds the profile as the versioned dict :func:`~tracetorch.records.jsonio.result_to_dict`
writes (what ``prof.save`` saves, so a field added to the JSON shows up in the page without a
change here), minus the per-call timeline, which the page does not draw and which is the bulky
part. Beside it sits a small ``report`` object: the text report's summary lines (the same
sentences ``print(prof)`` ends with), the title and the tracetorch version.

Everything is inline: the page's script and styles are the package's own files under
``tracetorch/report/assets/`` (plain JavaScript, no framework, no build step), and a
Content-Security-Policy forbids the page any request, so it opens from a file, an e-mail or a CI
artefact exactly as it was written. Data reaches the page only as JSON inside
``<script type="application/json">``, with ``<``, ``>`` and ``&`` written as ``\\u003c``-style
escapes, so no layer name can close the script or inject markup; the script puts names into the
page as text, never as HTML. The profile keeps every name exact; a name with control or bidi
characters is shown as the text report shows it (:func:`~tracetorch.text.units.printable`),
looked up in the extras' ``escaped`` table, so no U+202E reorders what the page shows.

The page holds the icicle chart of the call tree, the per-layer table (every column of the text
report, sortable, filterable, expandable by depth), the summary and run metadata, and the
roofline view when the profile carries machine peaks and per-layer bytes.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root(); root.child("fc</script>", "Linear", "m0").time.add(1_000)
    >>> page = render_html(ProfileResult(root))
    >>> page.startswith("<!DOCTYPE html>"), "fc</script>" in page
    (True, False)
    >>> "fc\\\\u003c/script\\\\u003e" in page
    True
"""
from __future__ import annotations

import html
import itertools
import json
import math
import os
import re
from collections.abc import Iterator
from importlib import resources
from typing import TYPE_CHECKING, Any, Union

from tracetorch.records.jsonio import deep_recursion, result_to_dict
from tracetorch.records.stats import TimeStats
from tracetorch.report.summary import summary_lines
from tracetorch.text.units import printable
from tracetorch.version import __version__

if TYPE_CHECKING:  # reports only read results, a result never imports a report
    from tracetorch.records.result import ProfileResult

__all__ = ("ASSETS", "PROFILE_ID", "REPORT_ID", "render_html", "save_html", "script_json",
           "page_data")

PathLike = Union[str, "os.PathLike[str]"]

#: The page's own files, inlined in this order (the charts define what the report script calls).
ASSETS = ("report.css", "charts.js", "report.js")
#: ``id`` of the ``<script type="application/json">`` element holding the profile.
PROFILE_ID = "tt-profile"
#: ``id`` of the element holding the report's extras (summary lines, title, version).
REPORT_ID = "tt-report"

# No request of any kind: the page is complete as written (inline script and styles only).
_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
           "img-src data:")

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{policy}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="tracetorch {version}">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body>
<noscript><p class="tt-noscript">This report draws itself with JavaScript; the profile is also
embedded below as JSON.</p></noscript>
<div id="tt-app"></div>
<script type="application/json" id="{profile_id}">{profile}</script>
<script type="application/json" id="{report_id}">{report}</script>
<script>
{js}
</script>
</body>
</html>
"""


def _asset(name: str) -> str:
    text = resources.files("tracetorch.report").joinpath("assets").joinpath(name).read_text(
        encoding="utf-8")
    # The assets are ours; this guards against an edit that would end the inline element early
    # or switch the HTML parser's script states.
    lowered = text.lower()
    for tag in ("</script", "<script", "</style", "<!--"):
        if tag in lowered:
            raise RuntimeError(f"tracetorch/report/assets/{name} must not contain {tag!r}")
    return text


def script_json(value: Any) -> str:
    r"""``value`` as compact JSON that is safe inside an HTML ``<script>`` element.

    ``<``, ``>`` and ``&`` can only occur inside JSON strings, where ``\u003c``-style escapes
    mean the same characters, so the text still parses to ``value`` while no ``</script>`` or
    ``<!--`` can appear in it. U+2028/U+2029 are escaped too, for older JavaScript parsers.

    Raises:
        ValueError: ``value`` holds NaN or an infinity (not JSON).

    Example:
        >>> script_json({"name": "</script><b>"})
        '{"name":"\\u003c/script\\u003e\\u003cb\\u003e"}'
    """
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text


def _title(result: ProfileResult) -> str:
    for key in ("name", "script"):
        value = result.meta.get(key)
        if isinstance(value, str) and value:
            return f"tracetorch profile: {printable(value)}"
    return "tracetorch profile"


def page_data(result: ProfileResult, title: str | None = None) -> tuple[dict[str, Any],
                                                                         dict[str, Any]]:
    """The two JSON objects the page embeds: the profile (``result_to_dict`` without the
    timeline) and the report extras (``title``, ``version``, ``summary`` as label/value pairs,
    ``notes``: the rest of the text summary, verbatim; ``escaped``: each name, type and path
    that :func:`~tracetorch.text.units.printable` changes, with what it shows instead;
    ``bottleneck`` with a machine; ``ranks`` for a merged distributed profile).

    Example:
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> profile_part, report_part = page_data(ProfileResult(CallNode.root()))
        >>> profile_part["format"], report_part["summary"][0][0]
        ('tracetorch-profile', 'Forward FLOPs')
    """
    with deep_recursion():
        data = result_to_dict(result)
        lines = summary_lines(result)
    # The page draws no timeline; the events would only make the file heavier.
    data["timeline"] = None
    summary, rest = _label_lines(lines)
    report: dict[str, Any] = {"title": title if title is not None else _title(result),
                              "version": __version__, "summary": summary, "notes": rest,
                              "escaped": _escaped(result)}
    bottleneck = _bottleneck(result)
    if bottleneck is not None:
        report["bottleneck"] = bottleneck
    ranks = _ranks(result)
    if ranks is not None:
        report["ranks"] = ranks
    return data, report


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON-like value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _escaped(result: ProfileResult) -> dict[str, str]:
    """``{text: printable(text)}`` for every node name, type and path and every string of the
    metadata that has a character to escape (empty for ordinary names): the page shows them
    through it."""
    escaped: dict[str, str] = {}
    texts = itertools.chain(_strings(result.meta), *(
        (node.name, node.type_name, node.path) for node in result.root.walk()))
    for text in texts:
        shown = printable(text)
        if shown != text:
            escaped[text] = shown
    return escaped


def _ranks(result: ProfileResult) -> dict[str, Any] | None:
    """A merged distributed profile's rank rows and straggler (as the merge saved them) and
    each layer's inclusive time across ranks, ``{path: [min, median, max ns, slowest rank]}``,
    read from the merge's saved spreads (``tracetorch.distributed.merge``'s format: one per
    node of a depth-first walk), so that no report module imports the distributed package."""
    facts = result.meta.get("distributed")
    if not isinstance(facts, dict) or not facts.get("merged"):
        return None
    spreads: dict[str, list[float]] = {}
    for node, saved in zip(result.root.walk(), facts.get("nodes") or ()):
        if not isinstance(saved, dict) or not isinstance(saved.get("total"), dict):
            continue
        total = saved["total"]
        stats = TimeStats.from_dict(total["stats"])
        if stats.count:
            spreads[node.path] = [stats.min_ns, stats.quantile(0.5), stats.max_ns,
                                  total["slowest"][0]]
    return {"ranks": facts.get("ranks", {}), "straggler": facts.get("straggler"),
            "world_size": facts.get("world_size"), "spreads": spreads}


#: A footer line "Label:  value" (a label of a few words, then the value).
_LABELLED = re.compile(r"([A-Z][\w ()/+-]{0,40}):\s+(\S.*)")


def _label_lines(lines: list[str]) -> tuple[list[list[str]], str]:
    """The summary's ``Label: value`` lines as pairs (an indented line continues the value
    above it), and what follows them (a section with its own layout, such as the bottleneck
    report) as one text, verbatim."""
    pairs: list[list[str]] = []
    for i, line in enumerate(lines):
        match = _LABELLED.fullmatch(line)
        if match:
            pairs.append([match.group(1), match.group(2).strip()])
        elif pairs and line.startswith(" ") and line.strip():
            pairs[-1][1] += " " + line.strip()
        else:
            return pairs, "\n".join(lines[i:]).strip("\n")
    return pairs, ""


def _bottleneck(result: ProfileResult) -> dict[str, Any] | None:
    """The bottleneck analysis's labels and roofline points (the same as the text report's),
    when the profile has a machine; the page draws its own estimate without them."""
    if result.machine is None:  # none, or set aside: the summary's Machine line says why
        return None
    analysis = result.analyze()
    # Points need finite numbers (JSON has no infinity): a layer that moved no bytes has none.
    points = [{"path": b.path, "bound": b.bound, "intensity": b.intensity,
               "achieved_flops": b.achieved_flops, "fraction_of_ceiling": b.fraction_of_ceiling}
              for b in analysis.layers if all(math.isfinite(v) for v in (
                  b.intensity, b.achieved_flops, b.fraction_of_ceiling))]
    return {"labels": {b.path: b.bound for b in analysis.layers}, "layers": points}


def render_html(result: ProfileResult, title: str | None = None) -> str:
    """The report page for ``result`` as one HTML document (see the module docstring).

    Args:
        result: a recorded or loaded profile.
        title: the page's title; by default ``"tracetorch profile"`` with ``meta["name"]`` or
            ``meta["script"]`` when the profile has one.

    Raises:
        TypeError: ``title`` is not a string or None.

    Example:
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> "<title>a &lt;b&gt;</title>" in render_html(ProfileResult(CallNode.root()), "a <b>")
        True
    """
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a string or None, got {type(title).__name__}")
    data, report = page_data(result, title)
    with deep_recursion():
        profile_json = script_json(data)
    scripts = "\n".join(_asset(name) for name in ASSETS if name.endswith(".js"))
    return _PAGE.format(
        policy=_POLICY, version=html.escape(report["version"]), title=html.escape(
            report["title"]), css=_asset("report.css"), profile_id=PROFILE_ID,
        report_id=REPORT_ID, profile=profile_json, report=script_json(report),
        # One scope for both scripts: the chart functions stay out of the page's globals.
        js=f'(function () {{\n"use strict";\n{scripts}\n}}());')


def save_html(result: ProfileResult, path: PathLike, title: str | None = None) -> None:
    """Write ``result``'s report page to ``path`` (UTF-8); open it in any browser, offline.

    Example:
        >>> import os, tempfile
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> path = os.path.join(tempfile.mkdtemp(), "report.html")
        >>> save_html(ProfileResult(CallNode.root()), path)
        >>> open(path, encoding="utf-8").read(15)
        '<!DOCTYPE html>'
    """
    page = render_html(result, title)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
