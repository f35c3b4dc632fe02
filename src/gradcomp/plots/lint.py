"""The figure lint: what a reader trips over, found from matplotlib's own extents after a draw.

`lint(figure)` returns the defects of a drawn figure (its suptitle set): text boxes that overlap or leave the
figure (tick labels, axis labels, titles, annotations, legends), a legend entry twice, an axis that runs more
than two decades beyond its data or cuts data off, one tick on a numeric axis (a scale nobody can read), a
name the title promises (an upper-case name such as PTQ or MXFP4) drawn nowhere, and categories placed on a
numeric axis (tick labels mixing numbers and words, or words on a log axis). `gradcomp draw` prints them;
`tests/test_figure_lint.py` requires none on every committed figure."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.collections import Collection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, StepPatch
from matplotlib.spines import Spine
from matplotlib.text import Text

# an axis may run this many powers of 10 beyond its data (log), or span 10**DECADES times it (linear)
DECADES = 2.0
SLACK = 1.0  # pixels two boxes may share, and a box may stick out of the figure, before it counts
NAME = re.compile(r"(?<![\w-])[A-Z][A-Z0-9]*[A-Z0-9](?![\w-])")  # PTQ, MXFP4, FP32: what a title names
NOT_SERIES = ("GEMM",)  # upper-case words a title may use that name no series (the matrix product R is of)
NUMBER = re.compile(r"^[−\-+]?(\d+(\.\d*)?|\.\d+)([eE][−\-+]?\d+)?%?$")


@dataclass(frozen=True)
class Defect:
    """One thing wrong with a figure: the check that found it, where, and what."""

    check: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.check} at {self.where}: {self.detail}"


def lint(figure: Figure) -> list[Defect]:
    """The defects of `figure` (draws it once to get every text's extent)."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    defects = _overlaps(figure, renderer) + _legends(figure)
    for index, ax in enumerate(_plot_axes(figure)):
        where = _name(ax, index)
        defects += _ranges(ax, where) + _categories(ax, where)
    return defects + _names(figure)


# --- text boxes ---------------------------------------------------------------------------------------------
def _plot_axes(figure: Figure) -> list[Axes]:
    return [ax for ax in figure.axes if ax.get_visible() and ax.axison]


def _name(ax: Axes, index: int) -> str:
    title = ax.get_title() or ax.get_title("left")
    return f"axes {index}" + (f" ({title[:40]})" if title else "")


def _shown(text: Text) -> bool:
    return text.get_visible() and bool(text.get_text().strip())


def _tick_labels(axis: Axis) -> Iterator[tuple[float, Text]]:
    """The tick labels an axis draws: those of ticks inside its view interval."""
    low, high = sorted(axis.get_view_interval())
    span = (high - low) or 1.0
    for locations, ticks in (
        (axis.get_majorticklocs(), axis.get_major_ticks()),
        (axis.get_minorticklocs(), axis.get_minor_ticks()),
    ):
        for location, tick in zip(locations, ticks, strict=False):
            inside = low - 1e-9 * span <= location <= high + 1e-9 * span
            for label in (tick.label1, tick.label2):
                if inside and _shown(label):
                    yield location, label


def _corners(artist, renderer) -> np.ndarray:
    """The 4 corners (pixels) of a drawn text as rotated (a rotated label's upright box would claim the space
    beside it), or of a legend's box."""
    box = artist.get_window_extent(renderer)
    angle = np.deg2rad(artist.get_rotation()) if isinstance(artist, Text) else 0.0
    if angle % (np.pi / 2) == 0:
        return np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])
    artist.set_rotation(0)  # the upright size, then back: the centre is the same either way
    upright = artist.get_window_extent(renderer)
    artist.set_rotation(np.rad2deg(angle))
    half = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * [upright.width / 2, upright.height / 2]
    turn = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return half @ turn.T + [(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2]


def _boxes(figure: Figure, renderer) -> list[tuple[str, np.ndarray]]:
    """Every drawn text of the figure as (what, its corners in pixels); a legend is one box."""
    boxes: list[tuple[str, np.ndarray]] = []

    def add(what: str, artist) -> None:
        boxes.append((what, _corners(artist, renderer)))

    if figure._suptitle is not None and _shown(figure._suptitle):
        add("suptitle", figure._suptitle)
    for text in figure.texts:
        if _shown(text) and text is not figure._suptitle:
            add(f"figure text {text.get_text()[:30]!r}", text)
    for legend in figure.legends:
        add("figure legend", legend)
    for index, ax in enumerate(_plot_axes(figure)):
        where = _name(ax, index)
        for title in (ax.title, ax._left_title, ax._right_title):
            if _shown(title):
                add(f"{where} title", title)
        for axis, letter in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            if _shown(axis.label):
                add(f"{where} {letter} label", axis.label)
            for _, label in _tick_labels(axis):
                add(f"{where} {letter} tick {label.get_text()[:20]!r}", label)
            offset = axis.get_offset_text()
            if _shown(offset):
                add(f"{where} {letter} offset", offset)
        for text in ax.texts:
            if _shown(text):
                add(f"{where} text {text.get_text()[:30]!r}", text)
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            add(f"{where} legend", legend)
    return boxes


def _overlap(corners: np.ndarray, others: np.ndarray) -> bool:
    """Whether two convex boxes share more than SLACK pixels (separating axes: they overlap unless some edge
    normal of either separates their projections)."""
    for shape in (corners, others):
        for edge in np.diff(np.vstack([shape, shape[:1]]), axis=0):
            normal = np.array([-edge[1], edge[0]]) / (np.hypot(*edge) or 1.0)
            first, second = corners @ normal, others @ normal
            if min(first.max(), second.max()) - max(first.min(), second.min()) <= 2 * SLACK:
                return False
    return True


def _overlaps(figure: Figure, renderer) -> list[Defect]:
    boxes = _boxes(figure, renderer)
    frame = figure.bbox.padded(SLACK)
    defects = [
        Defect(
            "leaves the figure",
            what,
            f"corners {np.round(corners).astype(int).tolist()} beyond "
            f"{np.round(figure.bbox.extents).astype(int).tolist()}",
        )
        for what, corners in boxes
        if not all(frame.contains(x, y) for x, y in corners)
    ]
    for (what, corners), (other, others) in combinations(boxes, 2):
        if _overlap(corners, others):
            defects.append(Defect("text overlaps", what, f"overprints {other}"))
    return defects


def _legends(figure: Figure) -> list[Defect]:
    legends: list[tuple[str, Legend]] = [("figure legend", legend) for legend in figure.legends]
    for index, ax in enumerate(_plot_axes(figure)):
        if ax.get_legend() is not None:
            legends.append((f"{_name(ax, index)} legend", ax.get_legend()))
    defects = []
    for where, legend in legends:
        labels = [text.get_text() for text in legend.get_texts()]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            defects.append(Defect("legend entry twice", where, ", ".join(map(repr, twice))))
    return defects


# --- axes and their data ------------------------------------------------------------------------------------
def _data(ax: Axes) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per axis ("x", "y"): the values of what must be seen whole (markers, error bars, bars, spans and
    reference lines), and of curves and filled bands (drawn over a wider grid than shown, to be cut by the
    view). A span or reference line drawn partly in axes coordinates (axhspan, axvline) counts on its data
    axis only."""
    found: dict[str, tuple[list, list]] = {"x": ([], []), "y": ([], [])}

    def add(points: np.ndarray, whole: bool, axes: str = "xy") -> None:
        points = np.asarray(points, dtype=float).reshape(-1, 2)
        for column, letter in enumerate("xy"):
            if letter in axes:
                found[letter][0 if whole else 1].append(points[:, column])

    data, along_y, along_x = ax.transData, ax.get_yaxis_transform(), ax.get_xaxis_transform()
    for artist in ax.get_children():
        if not artist.get_visible() or artist is ax.patch or isinstance(artist, Spine):
            continue
        if isinstance(artist, Line2D):  # a line is a curve (a reference diagonal too); markers alone are data
            transform, points = artist.get_transform(), artist.get_xydata()
            curve = artist.get_linestyle() not in ("None", "", " ")
        elif (
            isinstance(artist, Collection)
            and len(artist.get_offsets())
            and artist.get_offset_transform() == data
        ):
            transform, points, curve = data, artist.get_offsets(), False
        elif isinstance(artist, Collection):
            transform = artist.get_transform()
            paths = [path.vertices for path in artist.get_paths() if len(path.vertices)]
            points = np.concatenate(paths) if paths else np.empty((0, 2))
            curve = isinstance(artist, PolyCollection)
        elif isinstance(artist, Patch):
            transform, curve = artist.get_data_transform(), isinstance(artist, StepPatch)
            points = artist.get_path().transformed(artist.get_patch_transform()).vertices
        else:
            continue
        if transform == data:
            add(points, not curve)
        elif transform == along_y:  # axhline, axhspan: y in data, x in axes coordinates
            add(points, True, "y")
        elif transform == along_x:
            add(points, True, "x")
    return {letter: tuple(_finite(values) for values in lists) for letter, lists in found.items()}


def _finite(values: list) -> np.ndarray:
    flat = np.concatenate(values) if values else np.empty(0)
    return flat[np.isfinite(flat)]


def _ranges(ax: Axes, where: str) -> list[Defect]:
    defects = []
    found = _data(ax)
    for letter, (low, high), scale in (
        ("x", sorted(ax.get_xlim()), ax.get_xscale()),
        ("y", sorted(ax.get_ylim()), ax.get_yscale()),
    ):
        whole, curves = found[letter]
        if scale == "log":
            whole, curves = whole[whole > 0], curves[curves > 0]
        span = high - low
        if len(whole) and (whole.min() < low - 1e-6 * span or whole.max() > high + 1e-6 * span):
            defects.append(
                Defect(
                    "data off the axis",
                    f"{where} {letter}",
                    f"data {whole.min():.3g} to {whole.max():.3g}, axis {low:.3g} to {high:.3g}",
                )
            )
        values = np.concatenate([whole, curves[(curves >= low) & (curves <= high)]])
        if not len(values):
            continue
        first, last = values.min(), values.max()
        if scale == "log" and low > 0:
            beyond = max(np.log10(first / low), np.log10(high / last))
        elif scale == "linear" and last > first:
            beyond = np.log10(span / (last - first))
        else:
            continue
        if beyond > DECADES:
            defects.append(
                Defect(
                    "axis beyond its data",
                    f"{where} {letter}",
                    f"axis {low:.3g} to {high:.3g} for data {first:.3g} to {last:.3g}",
                )
            )
    return defects


def _numeric(label: str) -> bool:
    """A tick label that states a number (plain, or matplotlib's mathtext powers such as 10^{2})."""
    plain = label.strip().replace("$", "").replace("\\mathdefault", "").replace("{", "").replace("}", "")
    plain = plain.replace("\\times", "").replace("^", "e").replace("\\", "").replace(" ", "")
    return bool(NUMBER.match(plain)) or bool(re.match(r"^[−\-]?\d*e[−\-+]?\d+$", plain))


def _categories(ax: Axes, where: str) -> list[Defect]:
    defects = []
    for letter, axis, scale in (("x", ax.xaxis, ax.get_xscale()), ("y", ax.yaxis, ax.get_yscale())):
        labels = [label.get_text() for _, label in _tick_labels(axis)]
        words = [label for label in labels if not _numeric(label)]
        if len(labels) == 1 and not words:
            defects.append(Defect("one tick on a numeric axis", f"{where} {letter}", f"only {labels[0]!r}"))
        if words and (len(words) < len(labels) or scale != "linear"):
            kind = f"a {scale} axis" if scale != "linear" else "an axis of numbers"
            defects.append(
                Defect("categories on a numeric axis", f"{where} {letter}", f"{words[:4]} placed on {kind}")
            )
    return defects


# --- what the title names -----------------------------------------------------------------------------------
def _names(figure: Figure) -> list[Defect]:
    """Every upper-case name in the suptitle begins a word of another text of the figure (an axes' title, a
    legend, a tick label, an axis label or an annotation; any case: FP names FP6, LUQ names luq4): a title
    that names a series promises it is drawn."""
    title = figure._suptitle
    if title is None:
        return []
    axes = _plot_axes(figure)
    texts = [text.get_text() for text in figure.texts if text is not title]
    for legend in figure.legends + [ax.get_legend() for ax in axes if ax.get_legend() is not None]:
        texts += [text.get_text() for text in legend.get_texts()] + [legend.get_title().get_text()]
    for ax in axes:
        texts += [ax.get_title(where) for where in ("left", "center", "right")]
        texts += [ax.xaxis.label.get_text(), ax.yaxis.label.get_text()]
        texts += [text.get_text() for text in ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            texts += [label.get_text() for _, label in _tick_labels(axis)]
    drawn = " ".join(texts)
    missing = [
        name
        for name in dict.fromkeys(NAME.findall(title.get_text()))
        if name not in NOT_SERIES and not re.search(rf"(?<![\w-]){re.escape(name)}", drawn, re.IGNORECASE)
    ]
    return [Defect("named but not drawn", "suptitle", ", ".join(missing))] if missing else []
