"""The E2B drop-in's last mile, the code interpreter's part (issue 31, item 5), through the
unmodified `e2b-code-interpreter==2.11.5` against a Rampart daemon: default contexts Python and
JavaScript, a context in `/root` (the kernels run as root, as E2B's), Java's environment
(system properties and getenv) and printed lines, chart details (pie angles, a scatter's
missing title, an unknown chart), PIL's show() and save().

Configured only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. `python3 last_mile_ci.py
[test names...]`: prints `PASS name` / `FAIL name: why` and `SUMMARY`.
"""

import uuid

from harness import run, test
from e2b_code_interpreter import Sandbox as CodeSandbox
from e2b_code_interpreter.charts import ChartType, PieChart, ScatterChart

RUN = "lmci" + uuid.uuid4().hex[:10]


_ci = None


def ci():
    """One code-interpreter sandbox for the checks below, with an env var of its own."""
    global _ci
    if _ci is None:
        _ci = CodeSandbox.create(metadata={"suite": RUN}, timeout=900,
                                 envs={"TEST_ENV_VAR": "supertest"})
    return _ci


@test
def code_interpreter_lists_python_and_javascript_from_the_start():
    s = CodeSandbox.create(metadata={"suite": RUN}, timeout=300)
    try:
        # Asked at once, before anything ran: E2B lists both default contexts.
        languages = [c.language for c in s.list_code_contexts()]
        assert "python" in languages and "javascript" in languages, languages
        js = [c for c in s.list_code_contexts() if c.language == "javascript"][0]
        assert js.cwd == "/home/user", js.cwd
        # The listed JavaScript context runs code (once its kernel is up).
        e = s.run_code("1 + 1", language="js", timeout=120)
        assert e.error is None and e.text == "2", (e.error, e.text)
        assert [c.id for c in s.list_code_contexts() if c.language == "javascript"] == [js.id]
    finally:
        s.kill()


@test
def code_context_in_root():
    s = ci()
    ctx = s.create_code_context(language="python", cwd="/root", request_timeout=120)
    try:
        assert ctx.cwd == "/root"
        last = s.list_code_contexts()[-1]
        assert (last.id, last.language, last.cwd) == (ctx.id, "python", "/root")
        e = s.run_code("import os; os.getcwd()", context=ctx)
        assert e.error is None and e.text == "/root", (e.error, e.text)
        # The kernels run as root (as E2B's do); commands keep the sandbox's user.
        e = s.run_code("import os; os.getuid()", context=ctx)
        assert e.text == "0", e.text
        assert s.commands.run("whoami").stdout == "user\n"
        # A cwd that cannot be a directory is refused with the reason.
        try:
            s.create_code_context(cwd="/etc/hostname/sub")
        except Exception as err:  # noqa: BLE001 - the SDK's error for a 400
            assert "/etc/hostname/sub" in str(err), err
        else:
            raise AssertionError("a context under a file was made")
    finally:
        s.remove_code_context(ctx)


@test
def java_sees_the_environment_and_prints_lines_as_e2b():
    s = ci()
    e = s.run_code('System.out.println("Hello, World!")', language="java", timeout=180)
    assert e.error is None, e.error
    assert e.logs.stdout[0] == "Hello, World!", e.logs.stdout
    assert "".join(e.logs.stdout) == "Hello, World!\n", e.logs.stdout
    # The sandbox's variables, as system properties (E2B's) and in the environment.
    e = s.run_code('System.getProperty("TEST_ENV_VAR")', language="java")
    assert e.text is not None and e.text.strip() == "supertest", (e.error, e.text)
    e = s.run_code('System.getenv("TEST_ENV_VAR")', language="java")
    assert e.text == "supertest", (e.error, e.text)
    # A run's own, gone afterwards; a run's value over the sandbox's, which comes back.
    e = s.run_code('System.getProperty("FOO")', envs={"FOO": "bar"}, language="java")
    assert e.text is not None and e.text.strip() == "bar", (e.error, e.text)
    e = s.run_code('System.getenv("FOO")', envs={"FOO": "bar"}, language="java")
    assert e.text == "bar", (e.error, e.text)
    e = s.run_code('System.getProperty("FOO", "default")', language="java")
    assert e.text.strip() == "default", e.text
    e = s.run_code('System.getenv().containsKey("FOO")', language="java")
    assert e.text == "false", e.text
    e = s.run_code('System.getProperty("TEST_ENV_VAR")', language="java",
                   envs={"TEST_ENV_VAR": "overwrite"})
    assert e.text.strip() == "overwrite", e.text
    e = s.run_code('System.getProperty("TEST_ENV_VAR")', language="java")
    assert e.text.strip() == "supertest", e.text


PIE = """
import matplotlib.pyplot as plt
categories = ["No", "No, in blue"]
sizes = [90, 10]
fig, ax = plt.subplots(figsize=(8, 8))
plt.xlabel("x")
plt.ylabel("y")
ax.pie(sizes, labels=categories, autopct='%1.1f%%', startangle=90)
ax.axis('equal')
plt.title('Will I wake up early tomorrow?')
plt.show()
"""

SCATTER = """
import matplotlib.pyplot as plt
import numpy as np
plt.xlabel("A")
plt.ylabel("B")
plt.scatter(np.random.rand(5), np.random.rand(5), c='blue', label='Dataset 1')
plt.scatter(np.random.rand(10), np.random.rand(10), c='red', label='Dataset 2')
plt.show()
"""

UNKNOWN = """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.add_artist(plt.Circle((0, 0), 1, color='blue', fill=False, linewidth=2))
ax.add_artist(plt.Circle((0, 0), 2, color='red', fill=False, linewidth=2))
ax.grid(True)
plt.title('Two Concentric Circles')
plt.show()
"""


@test
def chart_details_as_e2b():
    s = ci()
    e = s.run_code(PIE)
    assert e.error is None, e.error
    chart = e.results[0].chart
    assert isinstance(chart, PieChart), chart
    assert chart.title == "Will I wake up early tomorrow?"
    assert [(d.label, d.angle, d.radius) for d in chart.elements] == [
        ("No", 324, 1), ("No, in blue", 36, 1)], [(d.label, d.angle) for d in chart.elements]
    e = s.run_code(SCATTER)
    chart = e.results[0].chart
    assert isinstance(chart, ScatterChart), chart
    assert chart.title is None, repr(chart.title)
    assert (chart.x_label, chart.y_label) == ("A", "B")
    assert [len(d.points) for d in chart.elements] == [5, 10]
    e = s.run_code(UNKNOWN)
    assert e.error is None, e.error
    assert e.results and e.results[0].png, e.results
    chart = e.results[0].chart
    assert chart is not None, "an unknown chart was dropped"
    assert chart.type == ChartType.UNKNOWN, chart.type
    assert chart.title == "Two Concentric Circles"
    assert len(chart.elements) == 0
    # A figure without data has no chart.
    e = s.run_code("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nplt.show()")
    assert all(r.chart is None for r in e.results), e.results


IMAGE = """
import numpy
from PIL import Image
imarray = numpy.random.rand(16, 16, 3) * 255
image = Image.fromarray(imarray.astype('uint8')).convert('RGBA')
"""


@test
def pil_show_and_save_give_a_png():
    s = ci()
    e = s.run_code(IMAGE + "image.show()\nprint('Image shown.')")
    assert e.error is None, e.error
    assert e.results and e.results[0].png, e.results
    assert e.logs.stdout == ["Image shown.\n"], e.logs.stdout
    e = s.run_code(IMAGE + f"image.save('/tmp/{RUN}.png')\nprint('Image saved.')")
    assert e.error is None, e.error
    assert e.results and e.results[0].png, e.results
    # Saved as well.
    assert s.files.read(f"/tmp/{RUN}.png", format="bytes")[:8] == b"\x89PNG\r\n\x1a\n"
    # Saving to a stream displays nothing.
    e = s.run_code(IMAGE + "import io\nimage.save(io.BytesIO(), format='PNG')")
    assert e.error is None and not e.results, (e.error, e.results)
    e = s.run_code(IMAGE + "image")
    assert e.results and e.results[0].png, e.results


@test
def zz_cleanup():
    if _ci is not None:
        assert _ci.kill()


if __name__ == "__main__":
    run()
