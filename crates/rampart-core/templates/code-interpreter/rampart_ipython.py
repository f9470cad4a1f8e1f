"""What Rampart's code interpreter adds to its IPython kernels (loaded by server.py at kernel
start with `rampart_ipython.load(get_ipython())`):

- a `str` shows as its text (`os.getenv("X")` gives `value`, not `'value'`), as E2B shows it;
- a pandas DataFrame also gives its columns as `data` (MIME `application/vnd.rampart.data+json`:
  `{column: [values...]}`);
- a matplotlib Figure also gives a structured `chart` (MIME
  `application/vnd.rampart.chart+json`) in the shape the e2b-code-interpreter SDK parses
  (`e2b_code_interpreter/charts.py`): `line`, `scatter`, `bar`, `pie`, `box_and_whisker`, or a
  `superchart` of one chart per Axes, with title (None when there is none, as E2B's), axis
  labels and units, scales, ticks and tick labels, and elements with their values, read from
  the figure's artists; an Axes with data of another kind is an `unknown` chart (its title, no
  elements), as E2B returns it; pie angles are rounded as E2B's extraction rounds them (324,
  not 323.99999999999994);
- a PIL image's `show()`, and its `save()` to a path, display it (a `png` result), as E2B's
  kernel hooks both.

Nothing here imports matplotlib, pandas or PIL until a figure or frame is displayed (or PIL is
imported by the cell).
"""

import datetime
import decimal
import math
import re

CHART_MIME = "application/vnd.rampart.chart+json"
DATA_MIME = "application/vnd.rampart.data+json"

_UNIT = re.compile(r"[\(\[]\s*([^\(\)\[\]]+?)\s*[\)\]]\s*$")


def _num(v):
    """A JSON-safe number (None for NaN/inf)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if math.isnan(f) or math.isinf(f):
        return None
    if f.is_integer() and abs(f) < 2**53:
        return int(f) if isinstance(v, (int,)) or _is_int_like(v) else f
    return f


def _is_int_like(v):
    try:
        import numpy as np  # noqa: PLC0415 (only when a chart or frame is shown)

        return isinstance(v, np.integer)
    except ImportError:
        return False


def _jsonable(v):
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return _num(v)
    if isinstance(v, (datetime.datetime, datetime.date)):
        return v.isoformat()
    try:
        import numpy as np  # noqa: PLC0415

        if isinstance(v, np.bool_):
            return bool(v)
        if isinstance(v, np.integer):
            return int(v)
        if isinstance(v, np.floating):
            return _num(float(v))
        if isinstance(v, np.datetime64):
            return str(v)
    except ImportError:
        pass
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def _unit(label):
    m = _UNIT.search(label or "")
    return m.group(1) if m else None


# -- charts ---------------------------------------------------------------------------------


def _axis_kind(axis):
    """`datetime`, `categorical`, or None for a numeric axis."""
    try:
        import matplotlib.category as mcat  # noqa: PLC0415
        import matplotlib.dates as mdates  # noqa: PLC0415
    except ImportError:
        return None
    conv = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
    if isinstance(conv, mcat.StrCategoryConverter):
        return "categorical"
    if isinstance(conv, (mdates.DateConverter, mdates._SwitchableDateConverter)) or isinstance(
        axis.get_major_formatter(), (mdates.DateFormatter, mdates.AutoDateFormatter,
                                     mdates.ConciseDateFormatter)):
        return "datetime"
    return None


def _categories(axis):
    """{position: name} of a categorical axis."""
    units = axis.get_units()
    mapping = getattr(units, "_mapping", None) or {}
    return {float(i): str(k) for k, i in mapping.items()}


def _value_on(axis, v):
    """A data coordinate as the chart gives it: a date as ISO text, a category as its name,
    else a number."""
    kind = _axis_kind(axis)
    if kind == "datetime":
        import matplotlib.dates as mdates  # noqa: PLC0415

        try:
            return mdates.num2date(float(v)).replace(tzinfo=None).isoformat()
        except (ValueError, OverflowError):
            return _num(v)
    if kind == "categorical":
        name = _categories(axis).get(float(v))
        if name is not None:
            return name
    return _num(v)


def _scale(ax, which):
    axis = ax.xaxis if which == "x" else ax.yaxis
    kind = _axis_kind(axis)
    if kind:
        return kind
    return ax.get_xscale() if which == "x" else ax.get_yscale()


def _ticks(ax, which):
    """(tick positions, tick labels) inside the view limits (the figure is drawn first)."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    ticks, labels = [], []
    for t in axis.get_major_ticks():
        loc = t.get_loc()
        if loc is None or not (lo - 1e-9 * (abs(lo) + 1) <= loc <= hi + 1e-9 * (abs(hi) + 1)):
            continue
        v = _value_on(axis, loc)
        if isinstance(v, float):
            v = float(f"{v:.12g}")  # 3.0000000000000004 -> 3.0
        ticks.append(v)
        labels.append(_plain_text(t.label1.get_text()))
    return ticks, labels


_MATHDEFAULT = re.compile(r"\\mathdefault\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


def _plain_text(text):
    """A tick label without matplotlib's mathtext wrapping: `$\\mathdefault{10^{2}}$` ->
    `10^2`."""
    if "$" not in text:
        return text
    t = text.replace("$", "")
    t = _MATHDEFAULT.sub(lambda m: m.group(1), t)
    t = re.sub(r"\^\{([^{}]*)\}", r"^\1", t)
    return t.replace("\\times", "×").replace("\\cdot", "·").replace("{", "").replace("}", "")


def _label(artist):
    lab = artist.get_label() if hasattr(artist, "get_label") else ""
    lab = "" if lab is None else str(lab)
    return "" if lab.startswith("_") else lab


def _title(ax):
    """An Axes' title, None when it has none (as E2B's charts give it)."""
    return ax.get_title() or None


def _base2d(ax, kind):
    xl, yl = ax.get_xlabel(), ax.get_ylabel()
    return {
        "type": kind,
        "title": _title(ax),
        "x_label": xl or None,
        "y_label": yl or None,
        "x_unit": _unit(xl),
        "y_unit": _unit(yl),
    }


def _points_chart(ax, kind, series):
    c = _base2d(ax, kind)
    xt, xtl = _ticks(ax, "x")
    yt, ytl = _ticks(ax, "y")
    c.update({
        "x_ticks": xt, "x_tick_labels": xtl, "x_scale": _scale(ax, "x"),
        "y_ticks": yt, "y_tick_labels": ytl, "y_scale": _scale(ax, "y"),
    })
    elements = []
    for label, pts in series:
        elements.append({
            "label": label,
            "points": [[_value_on(ax.xaxis, x), _value_on(ax.yaxis, y)] for x, y in pts],
        })
    c["elements"] = elements
    return c


def _tick_name(axis, pos):
    """The label of the tick at `pos` (a bar's category), else the position itself."""
    if _axis_kind(axis) == "categorical":
        name = _categories(axis).get(float(pos))
        if name is not None:
            return name
    for t in axis.get_major_ticks():
        loc = t.get_loc()
        if loc is not None and abs(loc - pos) < 1e-9 * (abs(pos) + 1):
            text = t.label1.get_text()
            if text:
                return text
    v = _num(pos)
    return str(v) if v is not None else ""


def _bar_chart(ax, containers):
    c = _base2d(ax, "bar")
    elements = []
    for cont in containers:
        horizontal = getattr(cont, "orientation", None) == "horizontal"
        group = _label(cont)
        for rect in cont.patches:
            if horizontal:
                pos = rect.get_y() + rect.get_height() / 2
                value = rect.get_width()
                name = _tick_name(ax.yaxis, pos)
            else:
                pos = rect.get_x() + rect.get_width() / 2
                value = rect.get_height()
                name = _tick_name(ax.xaxis, pos)
            elements.append({"label": name, "group": group, "value": _num(value)})
    c["elements"] = elements
    return c


def _angle(theta1, theta2):
    """A wedge's angle in degrees, rounded as E2B's extraction rounds it: the exact difference
    of the two floats, kept to 8 - (its exponent) significant digits (90% of a circle is 324,
    not 323.99999999999994)."""
    d = decimal.Decimal(float(theta2)) - decimal.Decimal(float(theta1))
    with decimal.localcontext() as ctx:
        ctx.prec = max(1, 8 - d.adjusted())
        return abs(float(+d))


def _pie_chart(ax, wedges):
    elements = []
    texts = [t.get_text() for t in ax.texts]
    for i, w in enumerate(wedges):
        label = _label(w)
        if not label and i < len(texts):
            label = texts[i]
        elements.append({
            "label": label,
            "angle": _num(_angle(w.theta1, w.theta2)),
            "radius": _num(w.r),
        })
    return {"type": "pie", "title": _title(ax), "elements": elements}


def _box_chart(ax, stats):
    c = _base2d(ax, "box_and_whisker")
    vertical = getattr(ax, "_rampart_box_vertical", True)
    axis = ax.xaxis if vertical else ax.yaxis
    elements = []
    for i, (pos, s) in enumerate(stats):
        label = s.get("label")
        if label is None or label == "":
            label = _tick_name(axis, pos)
        elements.append({
            "label": str(label),
            "min": _num(s["whislo"]),
            "first_quartile": _num(s["q1"]),
            "median": _num(s["med"]),
            "third_quartile": _num(s["q3"]),
            "max": _num(s["whishi"]),
            "outliers": [_num(v) for v in s.get("fliers", [])],
        })
    c["elements"] = elements
    return c


def chart_of_axes(ax):
    """The chart of one Axes, or None when it shows nothing this knows."""
    import matplotlib.container as mcont  # noqa: PLC0415
    import matplotlib.patches as mpatches  # noqa: PLC0415
    from matplotlib.collections import PathCollection  # noqa: PLC0415

    wedges = [p for p in ax.patches if isinstance(p, mpatches.Wedge)]
    if wedges:
        return _pie_chart(ax, wedges)
    stats = getattr(ax, "_rampart_boxes", None)
    if stats:
        return _box_chart(ax, stats)
    bars = [c for c in ax.containers if isinstance(c, mcont.BarContainer)]
    if bars:
        return _bar_chart(ax, bars)
    lines, dots = [], []
    for ln in ax.get_lines():
        if not ln.get_visible():
            continue
        xs, ys = ln.get_xdata(orig=False), ln.get_ydata(orig=False)
        pts = list(zip(list(xs), list(ys)))
        if ln.get_linestyle() in ("None", "", " ", "none"):
            dots.append((_label(ln), pts))
        else:
            lines.append((_label(ln), pts))
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and coll.get_visible():
            dots.append((_label(coll), [tuple(p) for p in coll.get_offsets().tolist()]))
    if lines:
        return _points_chart(ax, "line", lines)
    if dots:
        return _points_chart(ax, "scatter", dots)
    if ax.has_data():
        # Data of a kind this does not read (circles, images, ...): a chart all the same, of
        # type `unknown`, as E2B gives it.
        return {"type": "unknown", "title": _title(ax), "elements": []}
    return None


def chart_of_figure(fig):
    """The chart of a Figure: one Axes' chart, or a superchart of one per Axes; None for a
    figure without data."""
    try:
        fig.draw_without_rendering()  # tick labels are set only by a draw
    except Exception:  # noqa: BLE001 (a figure that cannot draw has no chart)
        return None
    axes = [a for a in fig.get_axes() if a.get_visible() and not hasattr(a, "_colorbar")]
    charts = [c for c in (chart_of_axes(a) for a in axes) if c is not None]
    if not charts:
        return None
    if len(axes) == 1:
        return charts[0]
    sup = getattr(fig, "_suptitle", None)
    return {
        "type": "superchart",
        "title": sup.get_text() if sup is not None else "",
        "elements": charts,
    }


def _record_bxp():
    """Wraps Axes.bxp (under boxplot, and seaborn's boxplot) to keep each box's statistics
    on its Axes, where the chart reads them."""
    from matplotlib.axes import Axes  # noqa: PLC0415

    if getattr(Axes.bxp, "_rampart", False):
        return
    orig = Axes.bxp

    def bxp(self, bxpstats, positions=None, *args, **kwargs):
        out = orig(self, bxpstats, positions, *args, **kwargs)
        stats = list(bxpstats)
        pos = list(positions) if positions is not None else list(range(1, len(stats) + 1))
        vert = kwargs.get("vert")
        orientation = kwargs.get("orientation")
        vertical = not (vert is False or orientation == "horizontal")
        boxes = list(getattr(self, "_rampart_boxes", []))
        boxes.extend(zip(pos, stats))
        self._rampart_boxes = boxes
        self._rampart_box_vertical = vertical
        return out

    bxp._rampart = True
    Axes.bxp = bxp


# -- formatters ---------------------------------------------------------------------------


def _frame_data(df):
    return {str(k): [_jsonable(v) for v in df[k].tolist()] for k in df.columns}


def load(ip):
    """Installs the formatters into the IPython shell `ip`."""
    from IPython.core.formatters import BaseFormatter  # noqa: PLC0415
    from traitlets import ObjectName, Unicode  # noqa: PLC0415

    class ChartFormatter(BaseFormatter):
        format_type = Unicode(CHART_MIME)
        print_method = ObjectName("_repr_rampart_chart_")
        _return_type = (dict,)

    class DataFormatter(BaseFormatter):
        format_type = Unicode(DATA_MIME)
        print_method = ObjectName("_repr_rampart_data_")
        _return_type = (dict,)

    df = ip.display_formatter
    chart = ChartFormatter(parent=df)
    data = DataFormatter(parent=df)
    df.formatters[CHART_MIME] = chart
    df.formatters[DATA_MIME] = data

    def figure_chart(fig):
        _record_bxp()
        return chart_of_figure(fig)

    # On FigureBase, not Figure: enabling the inline backend drops every formatter's Figure
    # printer (IPython's select_figure_formats); the lookup walks the class's MRO.
    chart.for_type_by_name("matplotlib.figure", "FigureBase", figure_chart)
    data.for_type_by_name("pandas.core.frame", "DataFrame", _frame_data)

    plain = df.formatters["text/plain"]
    # Only a str shown by itself: inside a container it keeps its quotes (the printer's stack
    # holds the objects being printed, the str itself last).
    plain.for_type(str, lambda s, p, cycle: p.text(s if len(p.stack) <= 1 else repr(s)))

    # Box statistics are recorded from the first boxplot on: Axes.bxp is wrapped as soon as
    # matplotlib's axes are imported (in whatever cell), without importing them here; PIL's
    # Image gets its show()/save() hooks as soon as it is imported.
    import builtins  # noqa: PLC0415
    import sys  # noqa: PLC0415

    def axes_ready():
        # Imported and done initializing (not half-way through matplotlib's own imports).
        return getattr(sys.modules.get("matplotlib.axes"), "Axes", None) is not None

    def pil_ready():
        cls = getattr(sys.modules.get("PIL.Image"), "Image", None)
        return cls is not None and hasattr(cls, "save") and hasattr(cls, "show")

    pending = [(axes_ready, _record_bxp), (pil_ready, _hook_pil)]

    def install_ready():
        for entry in list(pending):
            ready, install = entry
            if ready():
                pending.remove(entry)
                try:
                    install()
                except Exception:  # noqa: BLE001 (that hook is missing, the rest works)
                    pass

    install_ready()
    if not pending:
        return
    real_import = builtins.__import__

    def hooked(name, *args, **kwargs):
        mod = real_import(name, *args, **kwargs)
        if builtins.__import__ is hooked:
            install_ready()
            if not pending:
                builtins.__import__ = real_import
        return mod

    builtins.__import__ = hooked


def _hook_pil():
    """As E2B's kernel: a PIL image's `show()` displays it (no viewer is started), and its
    `save()` to a path displays it before saving; either gives the cell a `png` result."""
    from IPython.display import display  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    cls = Image.Image
    if getattr(cls.save, "_rampart", False):
        return
    real_save = cls.save

    def show(self, *args, **kwargs):
        display(self)

    def save(self, fp, format=None, **params):
        if isinstance(fp, str):
            display(self)
        return real_save(self, fp, format, **params)

    show._rampart = save._rampart = True
    cls.show = show
    cls.save = save
