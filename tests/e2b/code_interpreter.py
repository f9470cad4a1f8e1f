"""The unmodified `e2b-code-interpreter` Python SDK (sync and async) against a Rampart daemon.

Configured only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. Mirrors what the
code-interpreter's own tests check (python/tests/sync, async, charts, images, env_vars, cwd):
state across calls, the last expression as the main result, display() in every format,
matplotlib PNGs and their structured charts (line, scatter, bar, pie, box and whisker,
superchart), pandas `data`, streamed stdout/stderr, errors, timeouts, env vars (sandbox and per
run), contexts with a cwd; and each language (python, javascript/js, typescript/ts, r, java,
bash) in a stateful session of its own.
"""

import base64
import re
import uuid

import httpx

from harness import run, test
from e2b import NotFoundException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox
from e2b_code_interpreter.charts import (
    BarChart,
    BoxAndWhiskerChart,
    ChartType,
    LineChart,
    PieChart,
    ScaleType,
    ScatterChart,
    SuperChart,
)

RUN = "ci" + uuid.uuid4().hex[:10]
_shared = None


def sbx() -> Sandbox:
    """One code-interpreter sandbox shared by the tests (the SDK's default template)."""
    global _shared
    if _shared is None:
        _shared = Sandbox.create(metadata={"suite": RUN}, timeout=600)
    return _shared


@test
def create_uses_the_code_interpreter_template():
    s = sbx()
    info = s.get_info()
    assert info.template_id == "code-interpreter-v1", info.template_id
    # The sandbox is also an ordinary one: commands work (as `user`; the server and its
    # kernels run as root, as E2B's do).
    r = s.commands.run("whoami")
    assert r.stdout == "user\n", r.stdout
    procs = [p for p in s.commands.list() if p.tag == "code-interpreter"]
    assert len(procs) == 1, s.commands.list()


@test
def state_persists_across_calls():
    s = sbx()
    e = s.run_code("x = 40")
    assert e.error is None, e.error
    e = s.run_code("x += 2\nx")
    assert e.error is None, e.error
    assert e.text == "42", e.text
    assert len(e.results) == 1 and e.results[0].is_main_result
    assert e.execution_count is not None and e.execution_count >= 2, e.execution_count


@test
def last_expression_and_display():
    s = sbx()
    e = s.run_code(
        "from IPython.display import display, HTML\n"
        "display(HTML('<b>hi</b>'))\n"
        "display('plain')\n"
        "{'a': 1}"
    )
    assert e.error is None, e.error
    assert len(e.results) == 3, [r.formats() for r in e.results]
    html, plain, main = e.results
    assert not html.is_main_result and html.html == "<b>hi</b>", html.html
    # A str shows as its text (as E2B shows it), inside a container with its quotes.
    assert plain.text == "plain", plain.text
    assert main.is_main_result and main.text == "{'a': 1}", main.text
    assert e.text == "{'a': 1}"


@test
def matplotlib_png():
    s = sbx()
    e = s.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(3, 2))\n"
        "plt.plot([1, 2, 3], [3, 1, 2])\n"
        "plt.title('rampart')\n"
        "plt.show()\n"
    )
    assert e.error is None, e.error
    pngs = [r for r in e.results if r.png]
    assert len(pngs) == 1, [r.formats() for r in e.results]
    raw = base64.b64decode(pngs[0].png)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", raw[:8]
    assert "png" in pngs[0].formats()


@test
def stdout_stderr_stream_to_callbacks():
    s = sbx()
    out, err = [], []
    e = s.run_code(
        "import sys, time\n"
        "print('one', flush=True)\n"
        "print('warn', file=sys.stderr, flush=True)\n"
        "time.sleep(0.3)\n"
        "print('two', flush=True)\n",
        on_stdout=lambda m: out.append(m),
        on_stderr=lambda m: err.append(m),
    )
    assert e.error is None, e.error
    assert "".join(m.line for m in out) == "one\ntwo\n", out
    assert "".join(m.line for m in err) == "warn\n", err
    assert all(m.timestamp for m in out + err)
    assert "".join(e.logs.stdout) == "one\ntwo\n", e.logs.stdout
    assert "".join(e.logs.stderr) == "warn\n", e.logs.stderr
    # Two chunks separated in time arrive as separate messages.
    assert len(out) == 2, out


@test
def errors_have_name_value_traceback():
    s = sbx()
    seen = []
    e = s.run_code("def f():\n    return undefined_name\nf()", on_error=seen.append)
    assert e.error is not None
    assert e.error.name == "NameError", e.error.name
    assert "undefined_name" in e.error.value, e.error.value
    plain = re.sub(r"\x1b\[[0-9;]*m", "", e.error.traceback)
    assert "NameError" in plain and "f()" in plain, plain
    assert seen and seen[0].name == "NameError"
    # The context still works afterwards.
    assert s.run_code("1 + 1").text == "2"


@test
def env_vars_per_execution():
    s = sbx()
    e = s.run_code("import os; os.environ.get('RAMPART_CI')", envs={"RAMPART_CI": "yes"})
    assert e.text == "yes", e.text
    out = []
    e = s.run_code(
        "import os; print(os.environ['RAMPART_CI'])", envs={"RAMPART_CI": "supertest"},
        on_stdout=out.append,
    )
    assert e.error is None, e.error
    assert "".join(e.logs.stdout) == "supertest\n", e.logs.stdout
    assert [m.line for m in out] == ["supertest\n"], out
    e = s.run_code("import os; os.environ.get('RAMPART_CI')")
    assert e.text in (None, "None"), e.text


@test
def timeout_raises_and_the_context_recovers():
    s = sbx()
    s.run_code("y = 7")
    try:
        s.run_code("import time\ntime.sleep(30)", timeout=2)
    except TimeoutException:
        pass
    else:
        raise AssertionError("no TimeoutException")
    # The execution was interrupted: the next one runs at once, with the state kept.
    e = s.run_code("y * 6", timeout=20)
    assert e.error is None, e.error
    assert e.text == "42", e.text


@test
def contexts_create_run_list_restart_remove():
    s = sbx()
    ctx = s.create_code_context(cwd="/tmp")
    assert ctx.id and ctx.language == "python" and ctx.cwd == "/tmp", ctx
    e = s.run_code("import os; z = 5; os.getcwd()", context=ctx)
    assert e.text == "/tmp", e.text
    # Contexts are separate: the default one has no `z`.
    e = s.run_code("z")
    assert e.error is not None and e.error.name == "NameError", e.error
    assert s.run_code("z", context=ctx).text == "5"
    ids = [c.id for c in s.list_code_contexts()]
    assert ctx.id in ids, ids
    s.restart_code_context(ctx)
    e = s.run_code("z", context=ctx)
    assert e.error is not None and e.error.name == "NameError", "restart kept the state"
    s.remove_code_context(ctx.id)
    assert ctx.id not in [c.id for c in s.list_code_contexts()]
    try:
        s.run_code("1", context=ctx)
    except NotFoundException:
        pass
    else:
        raise AssertionError("running in a removed context did not raise NotFoundException")


@test
def port_49999_needs_the_token():
    s = sbx()
    url = s._jupyter_url
    headers = {"E2b-Sandbox-Id": s.sandbox_id, "E2b-Sandbox-Port": "49999"}
    r = httpx.get(f"{url}/contexts", headers=headers)
    assert r.status_code == 403, r.status_code
    r = httpx.get(
        f"{url}/contexts", headers={**headers, "E2B-Traffic-Access-Token": "nope"}
    )
    assert r.status_code == 403, r.status_code
    r = httpx.get(f"{url}/contexts", headers={**headers, "X-Access-Token": s._envd_access_token})
    assert r.status_code == 200, r.status_code


@test
def other_ports_reach_servers_in_the_sandbox():
    s = sbx()
    s.commands.run("mkdir -p /tmp/www && echo hello-port > /tmp/www/index.html")
    s.commands.run("cd /tmp/www && python3 -m http.server 8123 --bind 127.0.0.1", background=True)
    url = s._jupyter_url
    headers = {
        "E2b-Sandbox-Id": s.sandbox_id,
        "E2b-Sandbox-Port": "8123",
        "X-Access-Token": s._envd_access_token,
    }
    import time

    deadline = time.monotonic() + 20
    while True:
        r = httpx.get(f"{url}/index.html", headers=headers)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.status_code == 200 and r.text == "hello-port\n", (r.status_code, r.text)
    # A port with nothing on it: 502 "port is not open".
    r = httpx.get(f"{url}/", headers={**headers, "E2b-Sandbox-Port": "8124"})
    assert r.status_code == 502 and "port is not open" in r.text, (r.status_code, r.text)


@test
async def async_sdk_run_code_and_contexts():
    s = await AsyncSandbox.create(metadata={"suite": RUN, "kind": "async"}, timeout=300)
    try:
        out = []
        e = await s.run_code("a = 1\nprint('async')\na + 1", on_stdout=out.append)
        assert e.text == "2", e.text
        assert "".join(m.line for m in out) == "async\n", out
        ctx = await s.create_code_context()
        assert (await s.run_code("a", context=ctx)).error.name == "NameError"
        await s.remove_code_context(ctx)
        e = await s.run_code("1/0")
        assert e.error.name == "ZeroDivisionError", e.error
        # Other languages through the async SDK: a context each, state across calls,
        # streamed output, errors.
        for lang, define, use, want in [
            ("javascript", "let n = 41", "n + 1", "42"),
            ("typescript", "let n: number = 41", "n + 1", "42"),
            ("r", "n <- 41", "n + 1", "[1] 42"),
            ("java", "int n = 41;", "n + 1", "42"),
        ]:
            ctx = await s.create_code_context(language=lang)
            try:
                assert (await s.run_code(define, context=ctx, timeout=120)).error is None
                e = await s.run_code(use, context=ctx)
                assert e.text == want, (lang, e.text, e.error)
            finally:
                await s.remove_code_context(ctx)
        out, err = [], []
        e = await s.run_code("echo one; echo two >&2; echo three", language="bash",
                             on_stdout=out.append, on_stderr=err.append)
        # stdout and stderr apart, as separate streams (bash itself runs on a terminal).
        assert "".join(m.line for m in out) == "one\nthree\n", out
        assert "".join(m.line for m in err) == "two\n", err
        assert e.error is None, e.error
        assert "".join(e.logs.stderr) == "two\n", e.logs
        # A failing command: its stderr, then its exit status as the error.
        e = await s.run_code("ls /no/such/dir", language="bash")
        assert "No such file" in "".join(e.logs.stderr), e.logs
        assert e.error is not None and e.error.name == "ExitCode", e.error
    finally:
        await s.kill()

# -- results in every format, pandas data, charts --------------------------------------------


@test
def display_formats_html_markdown_svg_latex_json_jpeg():
    s = sbx()
    e = s.run_code(
        "from IPython.display import display, HTML, Markdown, SVG, Latex, JSON, Image\n"
        "import io, matplotlib.pyplot as plt\n"
        "display(Markdown('**bold**'))\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"2\" height=\"2\"></svg>'))\n"
        "display(Latex(r'$x^2$'))\n"
        "display(JSON({'k': [1, 2]}))\n"
        "buf = io.BytesIO(); f = plt.figure(figsize=(1, 1)); plt.plot([0, 1])\n"
        "f.savefig(buf, format='jpeg'); plt.close(f)\n"
        "display(Image(buf.getvalue(), format='jpeg'))\n"
        "HTML('<i>main</i>')\n"
    )
    assert e.error is None, e.error
    md, svg, latex, js, jpeg, main = e.results
    assert md.markdown == "**bold**" and "markdown" in md.formats(), md.formats()
    assert svg.svg.startswith("<svg") and "svg" in svg.formats(), svg.formats()
    assert latex.latex == "$x^2$", latex.latex
    assert js.json == {"k": [1, 2]}, js.json
    assert base64.b64decode(jpeg.jpeg)[:3] == b"\xff\xd8\xff", jpeg.formats()
    assert main.is_main_result and main.html == "<i>main</i>", main.formats()
    assert not any(r.is_main_result for r in (md, svg, latex, js, jpeg))


@test
def pandas_dataframe_has_data():
    s = sbx()
    e = s.run_code(
        "import pandas as pd\n"
        "pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', None], 'c': [0.5, float('nan'), 2.0]})"
    )
    assert e.error is None, e.error
    (r,) = e.results
    assert r.is_main_result and "data" in r.formats() and "html" in r.formats(), r.formats()
    assert r.data == {"a": [1, 2, 3], "b": ["x", "y", None], "c": [0.5, None, 2.0]}, r.data
    assert "<table" in r.html, r.html[:80]
    assert r.text.splitlines()[0].split() == ["a", "b", "c"], r.text


def chart_of(code):
    e = sbx().run_code("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n" + code
                       + "\nplt.show()\n")
    assert e.error is None, e.error
    charts = [r for r in e.results if r.chart is not None]
    assert len(charts) == 1, [r.formats() for r in e.results]
    r = charts[0]
    assert r.png and "chart" in r.formats(), r.formats()
    return r.chart


@test
def chart_line_field_by_field():
    c = chart_of(
        "ax.plot([1, 2, 3, 4], [1, 4, 9, 16], label='squares')\n"
        "ax.plot([1, 2, 3, 4], [2, 3, 4, 5], label='linear')\n"
        "ax.set_title('Growth'); ax.set_xlabel('Time (s)'); ax.set_ylabel('Distance [m]')\n"
        "ax.set_xticks([1, 2, 3, 4]); ax.set_yticks([0, 5, 10, 15])"
    )
    assert isinstance(c, LineChart) and c.type == ChartType.LINE, c.type
    assert c.title == "Growth", c.title
    assert (c.x_label, c.y_label) == ("Time (s)", "Distance [m]"), (c.x_label, c.y_label)
    assert (c.x_unit, c.y_unit) == ("s", "m"), (c.x_unit, c.y_unit)
    assert c.x_scale == ScaleType.LINEAR and c.y_scale == ScaleType.LINEAR
    assert c.x_ticks == [1, 2, 3, 4], c.x_ticks
    assert c.x_tick_labels == ["1", "2", "3", "4"], c.x_tick_labels
    assert c.y_ticks == [0, 5, 10, 15], c.y_ticks
    assert c.y_tick_labels == ["0", "5", "10", "15"], c.y_tick_labels
    assert [el.label for el in c.elements] == ["squares", "linear"]
    assert c.elements[0].points == [(1, 1), (2, 4), (3, 9), (4, 16)], c.elements[0].points
    assert c.elements[1].points == [(1, 2), (2, 3), (3, 4), (4, 5)], c.elements[1].points
    raw = c.to_dict()
    assert raw["type"] == "line" and raw["elements"][0]["points"][1] == [2, 4], raw


@test
def chart_scatter_with_log_scale():
    c = chart_of(
        "ax.scatter([1, 2, 3], [10, 100, 1000], label='a')\n"
        "ax.scatter([1.5, 2.5], [20, 200], label='b')\n"
        "ax.set_yscale('log'); ax.set_title('Spread'); ax.set_xlabel('x')"
    )
    assert isinstance(c, ScatterChart) and c.type == ChartType.SCATTER, c.type
    assert c.title == "Spread" and c.x_label == "x" and c.y_label is None, c.to_dict()
    assert c.x_unit is None and c.y_unit is None
    assert c.x_scale == ScaleType.LINEAR and c.y_scale == ScaleType.LOG, (c.x_scale, c.y_scale)
    assert [el.label for el in c.elements] == ["a", "b"]
    assert c.elements[0].points == [(1, 10), (2, 100), (3, 1000)], c.elements[0].points
    assert c.elements[1].points == [(1.5, 20), (2.5, 200)], c.elements[1].points
    assert {10, 100, 1000} <= set(c.y_ticks), c.y_ticks
    labels = dict(zip(c.y_ticks, c.y_tick_labels))
    assert labels[100] == "10^2", labels
    assert len(c.x_ticks) == len(c.x_tick_labels) > 0


@test
def chart_bar_stacked_groups():
    c = chart_of(
        "ax.bar(['apples', 'pears'], [3, 5], label='2023')\n"
        "ax.bar(['apples', 'pears'], [4, 1], bottom=[3, 5], label='2024')\n"
        "ax.set_title('Fruit'); ax.set_xlabel('kind'); ax.set_ylabel('count (kg)')"
    )
    assert isinstance(c, BarChart) and c.type == ChartType.BAR, c.type
    assert (c.title, c.x_label, c.y_label) == ("Fruit", "kind", "count (kg)")
    assert c.x_unit is None and c.y_unit == "kg", (c.x_unit, c.y_unit)
    got = [(el.label, el.group, el.value) for el in c.elements]
    assert got == [("apples", "2023", 3), ("pears", "2023", 5),
                   ("apples", "2024", 4), ("pears", "2024", 1)], got


@test
def chart_horizontal_bar():
    c = chart_of("ax.barh(['x', 'y', 'z'], [1.5, 2.5, 0.5]); ax.set_title('H')")
    assert c.type == ChartType.BAR and c.title == "H"
    got = [(el.label, el.value) for el in c.elements]
    assert got == [("x", 1.5), ("y", 2.5), ("z", 0.5)], got


@test
def chart_pie():
    c = chart_of(
        "ax.pie([1, 3], labels=['one', 'three'], radius=1.5); ax.set_title('Shares')"
    )
    assert isinstance(c, PieChart) and c.type == ChartType.PIE, c.type
    assert c.title == "Shares"
    got = [(el.label, round(el.angle, 6), el.radius) for el in c.elements]
    assert got == [("one", 90.0, 1.5), ("three", 270.0, 1.5)], got


@test
def chart_box_and_whisker():
    c = chart_of(
        "ax.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4]], labels=['a', 'b'])\n"
        "ax.set_title('Boxes'); ax.set_xlabel('group'); ax.set_ylabel('value')"
    )
    assert isinstance(c, BoxAndWhiskerChart) and c.type == ChartType.BOX_AND_WHISKER, c.type
    assert (c.title, c.x_label, c.y_label) == ("Boxes", "group", "value")
    a, b = c.elements
    assert (a.label, a.min, a.first_quartile, a.median, a.third_quartile, a.max) == (
        "a", 1, 2.25, 3.5, 4.75, 5), a.__dict__
    assert a.outliers == [20], a.outliers
    assert (b.label, b.min, b.first_quartile, b.median, b.third_quartile, b.max) == (
        "b", 2, 2.5, 3, 3.5, 4), b.__dict__
    assert b.outliers == [], b.outliers


@test
def chart_superchart_of_subplots():
    e = sbx().run_code(
        "import matplotlib.pyplot as plt\n"
        "fig, (left, right) = plt.subplots(1, 2)\n"
        "fig.suptitle('Both')\n"
        "left.plot([0, 1, 2], [2, 1, 0], label='down'); left.set_title('L')\n"
        "right.bar(['p', 'q'], [7, 8]); right.set_title('R')\n"
        "plt.show()\n"
    )
    assert e.error is None, e.error
    (r,) = [r for r in e.results if r.chart is not None]
    c = r.chart
    assert isinstance(c, SuperChart) and c.type == ChartType.SUPERCHART, c.type
    assert c.title == "Both", c.title
    left, right = c.elements
    assert isinstance(left, LineChart) and left.title == "L", left.to_dict()
    assert left.elements[0].label == "down" and left.elements[0].points == [(0, 2), (1, 1), (2, 0)]
    assert isinstance(right, BarChart) and right.title == "R", right.to_dict()
    assert [(el.label, el.value) for el in right.elements] == [("p", 7), ("q", 8)]


@test
def chart_datetime_axis():
    c = chart_of(
        "import datetime as dt\n"
        "days = [dt.datetime(2024, 1, d) for d in (1, 2, 3)]\n"
        "ax.plot(days, [1, 2, 3], label='d')"
    )
    assert c.type == ChartType.LINE and c.x_scale == ScaleType.DATETIME, c.x_scale
    assert [p[0] for p in c.elements[0].points] == [
        "2024-01-01T00:00:00", "2024-01-02T00:00:00", "2024-01-03T00:00:00"], c.elements[0].points
    assert all(isinstance(t, str) for t in c.x_ticks), c.x_ticks


# -- every language: a stateful session, errors, env vars, cwd, streaming ---------------------

# language -> how each check is written in it. `use` prints or shows 42 (`want`: the result
# text, or None when it is printed to stdout).
LANGS = {
    "python": dict(define="v = 20", use="v * 2 + 2", want="42",
                   err="1 / 0", err_name="ZeroDivisionError", err_value="division by zero",
                   env="import os; os.getenv('RAMPART_LANG_ENV')", env_want="{}",
                   cwd="import os; os.getcwd()", cwd_want="{}",
                   out="print('out-line')"),
    "javascript": dict(define="let v = 20", use="v * 2 + 2", want="42",
                       err="null.x", err_name="TypeError", err_value="Cannot read properties of null",
                       env="process.env.RAMPART_LANG_ENV", env_want="{}",
                       cwd="process.cwd()", cwd_want="{}",
                       out="console.log('out-line')"),
    "typescript": dict(define="const v: number = 20", use="v * 2 + 2", want="42",
                       err="throw new RangeError('bad range')", err_name="RangeError",
                       err_value="bad range",
                       env="Deno.env.get('RAMPART_LANG_ENV')", env_want="{}",
                       cwd="Deno.cwd()", cwd_want="{}",
                       out="console.log('out-line')"),
    "r": dict(define="v <- 20", use="v * 2 + 2", want="[1] 42",
              err="stop('bad things')", err_name="ERROR", err_value="bad things",
              env="Sys.getenv('RAMPART_LANG_ENV')", env_want='[1] "{}"',
              cwd="getwd()", cwd_want='[1] "{}"',
              out="cat('out-line\\n')"),
    "java": dict(define="int v = 20;", use="v * 2 + 2", want="42",
                 err='Integer.parseInt("nope")', err_name="NumberFormatException",
                 err_value='For input string: "nope"',
                 env='System.getenv("RAMPART_LANG_ENV")', env_want="{}",
                 cwd='System.getProperty("user.dir")', cwd_want="{}",
                 out='System.out.println("out-line");'),
    "bash": dict(define="v=20", use="echo $((v * 2 + 2))", want=None,
                 err="ls /no/such/dir", err_name="ExitCode", err_value="2",
                 env="echo $RAMPART_LANG_ENV", env_want=None,
                 cwd="pwd", cwd_want=None,
                 out="echo out-line"),
}


def shown(e, want):
    """The main result's text, or for want=None what was printed."""
    if want is None:
        return "".join(e.logs.stdout)
    return e.text


def check_language(s, lang):
    spec = LANGS[lang]
    cwd = f"/tmp/rampart-ci-{lang}-{RUN}"  # missing: the context makes it
    ctx = s.create_code_context(language=lang, cwd=cwd)
    assert ctx.language == lang and ctx.cwd == cwd, (ctx.language, ctx.cwd)
    assert ctx.id in [c.id for c in s.list_code_contexts()]
    try:
        # State across calls.
        e = s.run_code(spec["define"], context=ctx, timeout=120)
        assert e.error is None, (lang, e.error)
        e = s.run_code(spec["use"], context=ctx)
        assert e.error is None, (lang, e.error)
        want = spec["want"]
        got = shown(e, want)
        assert got == (want if want is not None else "42\n"), (lang, got, e.results)
        if want is not None:
            assert len(e.results) == 1 and e.results[0].is_main_result, (lang, e.results)
        # Streaming stdout.
        out = []
        e = s.run_code(spec["out"], context=ctx, on_stdout=out.append)
        assert e.error is None, (lang, e.error)
        assert "".join(m.line for m in out) == "out-line\n", (lang, out)
        assert all(m.timestamp and not m.error for m in out)
        # Errors: name, value, traceback; the context goes on.
        seen = []
        e = s.run_code(spec["err"], context=ctx, on_error=seen.append)
        assert e.error is not None, (lang, e.results)
        assert e.error.name == spec["err_name"], (lang, e.error.name, e.error.value)
        assert spec["err_value"] in e.error.value, (lang, e.error.value)
        assert isinstance(e.error.traceback, str) and e.error.traceback, (lang, e.error)
        assert seen and seen[0].name == spec["err_name"]
        e = s.run_code(spec["use"], context=ctx)
        assert shown(e, want) == (want if want is not None else "42\n"), (lang, "after error")
        # The working directory.
        e = s.run_code(spec["cwd"], context=ctx)
        assert e.error is None, (lang, e.error)
        cw = spec["cwd_want"]
        assert shown(e, cw) == (cw.format(cwd) if cw else cwd + "\n"), (lang, shown(e, cw))
        # Per-run env vars, gone afterwards.
        e = s.run_code(spec["env"], context=ctx, envs={"RAMPART_LANG_ENV": f"v-{lang}"})
        assert e.error is None, (lang, e.error)
        ew = spec["env_want"]
        val = f"v-{lang}"
        assert shown(e, ew) == (ew.format(val) if ew else val + "\n"), (lang, shown(e, ew))
        e = s.run_code(spec["env"], context=ctx)
        assert f"v-{lang}" not in (shown(e, ew) or ""), (lang, "env var left behind")
        # A fresh context of the language has none of this state.
        other = s.create_code_context(language=lang)
        try:
            assert other.cwd == "/home/user", other.cwd
            e = s.run_code(spec["use"], context=other)
            if lang == "bash":
                assert shown(e, None) == "2\n", shown(e, None)  # $v is empty there
            else:
                assert e.error is not None, (lang, "state leaked between contexts", e.results)
        finally:
            s.remove_code_context(other)
    finally:
        s.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in s.list_code_contexts()]


@test
def language_python_session():
    check_language(sbx(), "python")


@test
def language_javascript_session():
    check_language(sbx(), "javascript")


@test
def language_typescript_session():
    check_language(sbx(), "typescript")


@test
def language_r_session():
    check_language(sbx(), "r")


@test
def language_java_session():
    check_language(sbx(), "java")


@test
def language_bash_session():
    check_language(sbx(), "bash")


@test
def language_aliases_use_default_contexts():
    s = sbx()
    # `language=` without a context: that language's default context, state kept.
    for lang, define, use, want in [
        ("js", "var jsAlias = 41", "jsAlias + 1", "42"),
        ("javascript", "jsAlias * 2", None, "82"),  # the same default context as "js"
        ("ts", "let tsAlias: string = 'typed'", "tsAlias", "typed"),
        ("typescript", "tsAlias.length", None, "5"),
        ("r", "rAlias <- c(1, 2)", "sum(rAlias)", "[1] 3"),
        ("java", "String jAlias = \"j\";", "jAlias + jAlias", "jj"),
        ("bash", "bAlias=b", "echo $bAlias$bAlias", None),
    ]:
        e = sbx().run_code(define, language=lang, timeout=120)
        assert e.error is None, (lang, e.error)
        if use is None:
            assert e.text == want, (lang, e.text)
            continue
        e = s.run_code(use, language=lang)
        assert e.error is None, (lang, e.error)
        if want is None:
            assert "".join(e.logs.stdout) == "bb\n", e.logs.stdout
        else:
            assert e.text == want, (lang, e.text)
    langs = [c.language for c in s.list_code_contexts()]
    for lang in ("python", "javascript", "typescript", "r", "java", "bash"):
        assert lang in langs, (lang, langs)


@test
def unknown_language_is_refused():
    s = sbx()
    try:
        s.run_code("1", language="cobol")
    except Exception as e:  # noqa: BLE001 - the SDK's error for a 400
        assert "cobol" in str(e) and "not supported" in str(e), e
    else:
        raise AssertionError("cobol ran")
    try:
        s.create_code_context(language="cobol")
    except Exception as e:  # noqa: BLE001
        assert "not supported" in str(e), e
    else:
        raise AssertionError("a cobol context was made")


@test
def timeouts_in_other_languages():
    s = sbx()
    # R, Java and bash are interrupted and keep their state; Deno's kernel cannot be
    # interrupted, so a JavaScript execution that times out restarts its context.
    for lang, define, slow, use, want in [
        ("r", "keepR <- 7", "Sys.sleep(60)", "keepR * 6", "[1] 42"),
        ("java", "int keepJ = 7;", "Thread.sleep(60000);", "keepJ * 6", "42"),
        ("bash", "keepB=7", "sleep 60", "echo $((keepB * 6))", None),
    ]:
        ctx = s.create_code_context(language=lang)
        try:
            assert s.run_code(define, context=ctx, timeout=120).error is None
            try:
                s.run_code(slow, context=ctx, timeout=3)
            except TimeoutException:
                pass
            else:
                raise AssertionError(f"{lang}: no TimeoutException")
            e = s.run_code(use, context=ctx, timeout=60)
            assert e.error is None, (lang, e.error)
            assert shown(e, want) == (want or "42\n"), (lang, shown(e, want))
        finally:
            s.remove_code_context(ctx)
    ctx = s.create_code_context(language="javascript")
    try:
        s.run_code("let keepJs = 7", context=ctx)
        try:
            s.run_code("while (true) {}", context=ctx, timeout=3)
        except TimeoutException:
            pass
        else:
            raise AssertionError("javascript: no TimeoutException")
        e = s.run_code("typeof keepJs", context=ctx, timeout=60)
        assert e.error is None and e.text == "undefined", (e.error, e.text)
        assert s.run_code("6 * 7", context=ctx).text == "42"
    finally:
        s.remove_code_context(ctx)


@test
def sandbox_envs_reach_every_language():
    s = Sandbox.create(envs={"TEST_ENV_VAR": "supertest"}, metadata={"suite": RUN}, timeout=300)
    try:
        e = s.run_code("import os; print(os.environ['TEST_ENV_VAR'])")
        assert "".join(e.logs.stdout) == "supertest\n", e.logs.stdout
        assert s.run_code("import os; os.getenv('TEST_ENV_VAR')").text == "supertest"
        # A per-run value wins, and the sandbox's is back afterwards.
        e = s.run_code("import os; os.getenv('TEST_ENV_VAR')", envs={"TEST_ENV_VAR": "overwrite"})
        assert e.text == "overwrite", e.text
        assert s.run_code("import os; os.getenv('TEST_ENV_VAR')").text == "supertest"
        for lang, code, want in [
            ("javascript", "process.env.TEST_ENV_VAR", "supertest"),
            ("typescript", "Deno.env.get('TEST_ENV_VAR')", "supertest"),
            ("r", "Sys.getenv('TEST_ENV_VAR')", '[1] "supertest"'),
            ("java", 'System.getenv("TEST_ENV_VAR")', "supertest"),
        ]:
            e = s.run_code(code, language=lang, timeout=120)
            assert e.error is None and e.text == want, (lang, e.error, e.text)
            e = s.run_code(code, language=lang, envs={"TEST_ENV_VAR": "overwrite"})
            assert e.text == want.replace("supertest", "overwrite"), (lang, e.text)
            assert s.run_code(code, language=lang).text == want, (lang, "not restored")
        e = s.run_code("echo $TEST_ENV_VAR", language="bash")
        assert "".join(e.logs.stdout) == "supertest\n", e.logs.stdout
        # The default contexts' working directory is the user's home.
        e = s.run_code("from pathlib import Path; print(Path.cwd())")
        assert "".join(e.logs.stdout).strip() == "/home/user", e.logs.stdout
        for lang, code, want in [
            ("js", "process.cwd()", "/home/user"),
            ("ts", "process.cwd()", "/home/user"),
            ("r", "getwd()", '[1] "/home/user"'),
            ("java", 'System.getProperty("user.dir")', "/home/user"),
        ]:
            e = s.run_code(code, language=lang)
            assert e.error is None and e.text == want, (lang, e.error, e.text)
        e = s.run_code("pwd", language="bash")
        assert "".join(e.logs.stdout) == "/home/user\n", e.logs.stdout
        # The sandbox is a code-interpreter one: more memory than the daemon's 512 MiB default.
        assert s.get_info().memory_mb >= 2048, s.get_info().memory_mb
    finally:
        s.kill()


@test
def context_cwd_is_made_and_refused_when_it_cannot_be():
    s = sbx()
    ctx = s.create_code_context(language="python", cwd="/home/user/test")
    try:
        assert ctx.cwd == "/home/user/test"
        e = s.run_code("import os; os.getcwd()", context=ctx)
        assert e.text == "/home/user/test", e.text
        last = s.list_code_contexts()[-1]
        assert (last.id, last.language, last.cwd) == (ctx.id, "python", "/home/user/test")
    finally:
        s.remove_code_context(ctx)
    try:
        s.create_code_context(cwd="/etc/hostname/nope")
    except Exception as e:  # noqa: BLE001 - the SDK's error for a 400
        assert "/etc/hostname/nope" in str(e) and "Not a directory" in str(e), e
    else:
        raise AssertionError("a context under a file was made")


@test
def zz_cleanup_shared():
    if _shared is not None:
        assert _shared.kill()


if __name__ == "__main__":
    run()
