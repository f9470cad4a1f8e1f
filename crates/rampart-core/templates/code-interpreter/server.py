#!/usr/bin/python3
"""Rampart's code interpreter: E2B's code-interpreter HTTP API over IPython kernels.

Runs inside a sandbox of the `code-interpreter-v1` template, as root (as E2B's kernels do; root
inside a sandbox is an unprivileged uid outside), started by the daemon right after the
sandbox's agent answers, in the directory its default contexts use (`/home/user`). Listens on
127.0.0.1:49999 (the daemon reaches it through the agent's port tunnel) once the default Python
context's kernel is ready; the default JavaScript context is listed from then on and its kernel
starts in the background (an execution on it waits for it).

API (as `e2b-code-interpreter` 2.11 calls it):

  POST   /execute                 {"code", "context_id", "language", "env_vars"}
                                  -> 200 NDJSON: stdout / stderr / result / error /
                                     number_of_executions / keepalive ... end_of_execution
  POST   /contexts                {"language"?, "cwd"?} -> {"id", "language", "cwd"}
  GET    /contexts                -> [{"id", "language", "cwd"}]
  DELETE /contexts/{id}           -> 204
  POST   /contexts/{id}/restart   -> 204
  GET    /health                  -> 200 "OK"

An unknown context answers 404 (text/plain `Context <id> not found`). A client that goes away
during an execution (the SDK's timeout) interrupts it.

Languages, each context its own kernel (see `KERNELS`): `python` (IPython; with
rampart_ipython.py: a str shows as its text, DataFrames give `data`, matplotlib figures a
`chart`), `javascript`/`js` and `typescript`/`ts` (Deno's Jupyter kernel, also as `deno`), `r`
(IRkernel), `java` (java_kernel.py over JShell), `bash` (bash_kernel, its stderr kept apart
by rampart_bash_kernel.py). A language whose kernel
is not installed answers 400 with what is missing. Nothing is downloaded here: the kernels come
from Debian packages and from /usr/local/lib/rampart-kernels (scripts/setup-host.sh, or the
image's build steps).

Standard library plus jupyter_client (Debian's python3-jupyter-client / python3-ipykernel).
"""

import datetime
import glob
import http.server
import json
import os
import pwd
import queue
import shlex
import shutil
import select
import socket
import sys
import threading
import time
import uuid

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import KernelManager

HERE = os.path.dirname(os.path.abspath(__file__))
HOST = "127.0.0.1"
PORT = int(os.environ.get("RAMPART_CODE_INTERPRETER_PORT", "49999"))
KERNELS_DIR = os.environ.get("RAMPART_KERNELS_DIR", "/usr/local/lib/rampart-kernels")
KEEPALIVE_SECS = 5.0
KERNEL_READY_SECS = 120.0
CHART_MIME = "application/vnd.rampart.chart+json"
DATA_MIME = "application/vnd.rampart.data+json"

# Names the SDKs send -> the context's language.
ALIASES = {
    "python": "python", "python3": "python", "py": "python",
    "javascript": "javascript", "js": "javascript",
    "typescript": "typescript", "ts": "typescript",
    "deno": "deno",
    "r": "r",
    "java": "java",
    "bash": "bash", "sh": "bash", "shell": "bash",
}

# MIME type -> the SDK's `Result` field.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    CHART_MIME: "chart",
    DATA_MIME: "data",
}


def log(msg):
    sys.stderr.write(f"code-interpreter: {msg}\n")
    sys.stderr.flush()


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class ClientGone(Exception):
    """The HTTP client closed its connection."""


class KernelMissing(Exception):
    """The language's kernel is not installed here."""


def _home():
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return os.environ.get("HOME") or "/tmp"


HOME = _home()


def _default_cwd():
    """Where the default contexts (and a context made without a `cwd`) run: the directory the
    daemon starts the server in (E2B's `/home/user`)."""
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    for d in (cwd, HOME, "/tmp"):
        if d and os.path.isdir(d):
            return d
    return "/"


DEFAULT_CWD = _default_cwd()


def _deno():
    for p in sorted(glob.glob(os.path.join(KERNELS_DIR, "node/node_modules/@deno/*/deno"))):
        if os.access(p, os.X_OK):
            return p
    return shutil.which("deno")


def _has_python_module(mod, path=None):
    import importlib.util  # noqa: PLC0415

    if path:
        sys.path.insert(0, path)
    try:
        return importlib.util.find_spec(mod) is not None
    finally:
        if path:
            sys.path.remove(path)


# Deno: plain text (no ANSI colours in results), no update checks and no prompts (nothing is
# fetched at run time, nobody answers).
DENO_ENV = {"NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1", "DENO_NO_PROMPT": "1"}


def kernel_for(language):
    """(argv, extra env) that start `language`'s kernel; raises KernelMissing."""
    py = sys.executable or "/usr/bin/python3"
    if language == "python":
        return [py, "-m", "ipykernel_launcher", "-f", "{connection_file}"], {}
    if language in ("javascript", "typescript", "deno"):
        deno = _deno()
        if deno is None:
            raise KernelMissing(
                f"the {language} kernel (Deno, npm `deno`) is not installed in "
                f"{KERNELS_DIR}/node (scripts/setup-host.sh installs it)")
        return [deno, "jupyter", "--kernel", "--conn", "{connection_file}"], DENO_ENV
    if language == "r":
        r = shutil.which("R")
        if r is None or not glob.glob("/usr/lib/R/site-library/IRkernel") + glob.glob(
                "/usr/local/lib/R/site-library/IRkernel"):
            raise KernelMissing(
                "the R kernel is not installed (Debian's r-base-core and r-cran-irkernel)")
        return [r, "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"], {}
    if language == "java":
        if shutil.which("java") is None or shutil.which("jshell") is None:
            raise KernelMissing("the Java kernel needs JShell (Debian's default-jdk-headless)")
        return [py, os.path.join(HERE, "java_kernel.py"), "-f", "{connection_file}"], {}
    if language == "bash":
        path = os.path.join(KERNELS_DIR, "python")
        if not _has_python_module("bash_kernel", path):
            raise KernelMissing(
                f"the bash kernel (PyPI bash_kernel) is not installed in {path} "
                "(scripts/setup-host.sh installs it)")
        pp = os.environ.get("PYTHONPATH")
        # bash_kernel, with stderr kept apart (rampart_bash_kernel.py).
        return [py, os.path.join(HERE, "rampart_bash_kernel.py"), "-f", "{connection_file}"], {
            "PYTHONPATH": path + (os.pathsep + pp if pp else "")}
    raise KernelMissing(f"language {language!r} is not supported")


def _js_str(s):
    return json.dumps(s)


def env_code(language, env):
    """Code that sets (value str) or removes (value None) environment variables in a kernel
    of `language`, run silently around an execution with `env_vars`."""
    if language == "python":
        code = "import os as __rampart_os\n"
        for k, v in env.items():
            if v is None:
                code += f"__rampart_os.environ.pop({json.dumps(k)}, None)\n"
            else:
                code += f"__rampart_os.environ[{json.dumps(k)}] = {json.dumps(v)}\n"
        return code + "del __rampart_os\n"
    if language in ("javascript", "typescript", "deno"):
        return "".join(
            f"Deno.env.delete({_js_str(k)});" if v is None
            else f"Deno.env.set({_js_str(k)}, {_js_str(v)});" for k, v in env.items())
    if language == "r":
        return "\n".join(
            f"invisible(Sys.unsetenv({json.dumps(k)}))" if v is None
            else f"invisible(do.call(Sys.setenv, setNames(list({json.dumps(v)}), {json.dumps(k)})))"
            for k, v in env.items())
    if language == "bash":
        return "\n".join(
            f"unset {shlex.quote(k)}" if v is None else f"export {shlex.quote(k)}={shlex.quote(v)}"
            for k, v in env.items())
    if language == "java":
        return "%rampart-env " + json.dumps(env)
    raise KernelMissing(f"language {language!r} is not supported")


def _unquote_js(text):
    """A string value as Deno shows it ("x", 'x' or `x`) -> its text; anything else as is."""
    if len(text) < 2 or text[0] != text[-1] or text[0] not in "\"'`":
        return text
    q = text[0]
    body = text[1:-1]
    if q == '"':
        try:
            v = json.loads(text)
            return v if isinstance(v, str) else text
        except ValueError:
            return text
    # Deno escapes only the quote, backslashes and control characters in the other styles.
    try:
        return json.loads('"' + body.replace('\\' + q, q).replace('"', '\\"') + '"')
    except ValueError:
        return text


class Context:
    """One IPython kernel, its cwd, and the lock that serializes executions on it."""

    def __init__(self, cid, language, cwd):
        self.id = cid
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        self.km = None
        self.kc = None

    def json(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self):
        argv, extra = kernel_for(self.language)
        env = dict(os.environ)
        env.update(extra)
        env["HOME"] = HOME
        env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        env.setdefault("LANG", "C.UTF-8")
        km = KernelManager()
        # The spec is given, not looked up: the kernels need no kernelspec directories.
        km._kernel_spec = KernelSpec(argv=argv, display_name=self.language,
                                     language=self.language, resource_dir=HERE, env={})
        km.start_kernel(cwd=self.cwd, env=env)
        kc = km.blocking_client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=KERNEL_READY_SECS)
        except Exception:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        self.km, self.kc = km, kc
        try:
            self.wait_iopub()
        except Exception:
            self.stop()
            raise
        if self.language == "python":
            self.run_silent(
                "import sys as __rampart_sys\n"
                f"__rampart_sys.path.insert(0, {HERE!r})\n"
                "import rampart_ipython as __rampart_ip\n"
                f"__rampart_sys.path.remove({HERE!r})\n"
                "__rampart_ip.load(get_ipython())\n"
                "del __rampart_sys, __rampart_ip\n")
            self.drain()

    def deno(self):
        return self.language in ("javascript", "typescript", "deno")

    def wait_iopub(self):
        """Waits until the kernel's iopub messages reach us: a subscription made just now may
        miss what is published before it is connected (ZeroMQ's slow joiner), and the first
        execution's outputs with it. A kernel_info request's status messages show it is."""
        deadline = time.monotonic() + KERNEL_READY_SECS
        while time.monotonic() < deadline:
            mid = self.kc.kernel_info()
            until = time.monotonic() + 0.5
            while time.monotonic() < until:
                try:
                    msg = self.kc.get_iopub_msg(timeout=0.1)
                except queue.Empty:
                    continue
                if msg.get("parent_header", {}).get("msg_id") == mid:
                    self.drain()
                    while True:  # its shell reply
                        try:
                            self.kc.get_shell_msg(timeout=0)
                        except queue.Empty:
                            break
                    return
            if not self.km.is_alive():
                raise RuntimeError("the kernel exited at start")
        raise RuntimeError("the kernel's messages did not arrive")

    def stop(self):
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            try:
                self.km.shutdown_kernel(now=True)
            except Exception as e:  # already dead
                log(f"shutting down kernel of {self.id}: {e}")
        self.km = self.kc = None

    def restart(self):
        self.stop()
        self.start()

    def alive(self):
        return self.km is not None and self.km.is_alive()

    def drain(self):
        """Drops iopub messages left over from earlier executions."""
        while True:
            try:
                self.kc.get_iopub_msg(timeout=0)
            except queue.Empty:
                return

    def run_silent(self, code):
        """Runs `code` without output or history and waits for its reply."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                reply = self.kc.get_shell_msg(timeout=1)
            except queue.Empty:
                if not self.alive():
                    return
                continue
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                return

    def execute(self, code, env_vars, emit, client_gone):
        """Runs `code`, calling `emit(dict)` for every output line; returns once idle."""
        self.drain()
        restore = None
        if env_vars:
            restore = {k: os.environ.get(k) for k in env_vars}
            self.run_silent(env_code(self.language, env_vars))
            self.drain()
        try:
            self._execute(code, emit, client_gone)
        finally:
            if env_vars and self.alive():
                # Put back what the variables were in the server (the kernel's start env).
                self.run_silent(env_code(self.language, restore))
                self.drain()

    def _execute(self, code, emit, client_gone):
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        count = None
        try:
            count = self._follow(msg_id, emit, client_gone)
        except ClientGone:
            self.interrupt(msg_id)
            raise
        if count is not None:
            emit({"type": "number_of_executions", "execution_count": count})

    def _follow(self, msg_id, emit, client_gone):
        """Streams the outputs of execution `msg_id` until the kernel is idle; returns its
        execution count."""
        last_sent = time.monotonic()
        count = None
        idle = False
        # IRkernel shows a cell's value as display_data: the last result of an execution
        # without error is its main result (held back until the next output or the end).
        held = None
        failed = False
        fence = None
        while not idle:
            if client_gone():
                raise ClientGone()
            try:
                msg = self.kc.get_iopub_msg(timeout=0.25)
            except queue.Empty:
                if not self.alive():
                    emit({
                        "type": "error",
                        "name": "UnexpectedEndOfExecution",
                        "value": "the kernel died during the execution",
                        "traceback": "",
                    })
                    break
                if time.monotonic() - last_sent >= KEEPALIVE_SECS:
                    emit({"type": "keepalive"})
                    last_sent = time.monotonic()
                continue
            parent = msg.get("parent_header", {}).get("msg_id")
            if fence is not None and parent == fence:
                # Every message Deno published for the execution came before this one.
                if msg["msg_type"] == "status":
                    fence, idle = None, True
                    if held is not None:
                        held["is_main_result"] = not failed
                        emit(held)
                        held = None
                continue
            if parent != msg_id:
                continue
            t = msg["msg_type"]
            c = msg["content"]
            out = None
            if t == "stream":
                out = {"type": c.get("name", "stdout"), "text": c.get("text", ""),
                       "timestamp": now_iso()}
                if out["type"] not in ("stdout", "stderr"):
                    out["type"] = "stdout"
            elif t == "execute_result":
                out = result_of(self.language, c.get("data", {}), True)
            elif t == "display_data":
                out = result_of(self.language, c.get("data", {}), False)
                if self.language == "r":
                    if held is not None:
                        emit(held)
                    held, out = out, None
            elif t == "error":
                failed = True
                out = {
                    "type": "error",
                    "name": c.get("ename", ""),
                    "value": c.get("evalue", ""),
                    "traceback": "\n".join(c.get("traceback", [])),
                }
                if self.language == "bash" and not out["name"]:
                    # bash_kernel reports a failed command by its exit status alone.
                    out["name"] = "ExitCode"
                    out["traceback"] = out["traceback"] or f"exit status {out['value']}"
            elif t == "execute_input":
                count = c.get("execution_count")
            elif t == "status" and c.get("execution_state") == "idle" and self.deno():
                # Deno may publish an execution's result after its idle status: a
                # kernel_info request is a fence, its status comes after all of them.
                fence = self.kc.kernel_info()
            elif t == "status" and c.get("execution_state") == "idle":
                idle = True
                if held is not None:
                    held["is_main_result"] = not failed
                    out, held = held, None
            if out is not None:
                if held is not None:
                    emit(held)
                    held = None
                emit(out)
                last_sent = time.monotonic()
        if held is not None:
            emit(held)
        return count

    def interrupt(self, msg_id):
        """Interrupts the running execution and waits (bounded) for the kernel to be idle;
        restarts the kernel if it does not get there."""
        if self.language in ("javascript", "typescript", "deno"):
            # Deno's kernel cannot be interrupted (SIGINT ends it; an interrupt_request is not
            # answered): a fresh kernel is the only way to stop what runs.
            log(f"context {self.id} ({self.language}): restarting its kernel to stop the execution")
            self.restart()
            return
        try:
            self.km.interrupt_kernel()
        except Exception as e:
            log(f"interrupting {self.id}: {e}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not self.alive():
                log(f"context {self.id} ended at the interrupt: restarting its kernel")
                self.restart()
                return
            try:
                msg = self.kc.get_iopub_msg(timeout=0.25)
            except queue.Empty:
                continue
            if (msg.get("parent_header", {}).get("msg_id") == msg_id
                    and msg["msg_type"] == "status"
                    and msg["content"].get("execution_state") == "idle"):
                return
        log(f"context {self.id} did not stop after an interrupt: restarting its kernel")
        self.restart()


def result_of(language, data, is_main):
    out = {"type": "result", "is_main_result": is_main}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        else:
            out[field] = value
    if language in ("javascript", "typescript", "deno") and isinstance(out.get("text"), str):
        out["text"] = _unquote_js(out["text"])
    if extra:
        out["extra"] = extra
    return out


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.defaults = {}  # language -> its default context

    def create(self, language, cwd):
        ctx = Context(str(uuid.uuid4()), language, cwd)
        ctx.start()
        with self.lock:
            self.by_id[ctx.id] = ctx
        return ctx

    def get(self, cid):
        with self.lock:
            return self.by_id.get(cid)

    def remove(self, cid):
        with self.lock:
            ctx = self.by_id.pop(cid, None)
            if ctx is not None and self.defaults.get(ctx.language) is ctx:
                del self.defaults[ctx.language]
        return ctx

    def all(self):
        with self.lock:
            return list(self.by_id.values())

    def reserve_default(self, language):
        """The language's default context and whether it is new. A new one is listed at once
        and returned with its lock held: the caller starts its kernel ([`boot`]), and every
        execution on it waits for that."""
        with self.lock:
            d = self.defaults.get(language)
            if d is not None:
                return d, False
            d = Context(str(uuid.uuid4()), language, DEFAULT_CWD)
            d.lock.acquire()
            self.defaults[language] = d
            self.by_id[d.id] = d
            return d, True

    def boot(self, ctx):
        """Starts the kernel of a context [`reserve_default`] made, then releases its lock; a
        kernel that cannot start takes its context off the list."""
        try:
            ctx.start()
        except BaseException:
            self.remove(ctx.id)
            raise
        finally:
            ctx.lock.release()

    def default_context(self, language="python"):
        """The language's default context (made at its first use), in the default directory."""
        d, new = self.reserve_default(language)
        if new:
            self.boot(d)
        return d


CONTEXTS = Contexts()


def canonical(language):
    """(the context language for an SDK's `language`, None) or (None, why it is refused)."""
    if language is None or language == "":
        return "python", None
    if not isinstance(language, str):
        return None, "`language` must be a string"
    lang = ALIASES.get(language.strip().lower())
    if lang is None:
        return None, (f"language {language!r} is not supported: this interpreter runs "
                      "python, javascript (js), typescript (ts), r, java and bash")
    return lang, None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rampart-code-interpreter/1"

    def log_message(self, fmt, *args):
        pass

    # -- helpers -------------------------------------------------------------------------

    def send_body(self, status, body, content_type="application/json"):
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_empty(self, status=204):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def not_found(self, cid):
        self.send_body(404, f"Context {cid} not found", "text/plain; charset=utf-8")

    def bad_request(self, msg):
        self.send_body(400, msg, "text/plain; charset=utf-8")

    def read_json(self):
        n = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                raw += self.rfile.read(size)
                self.rfile.readline()
        else:
            raw = self.rfile.read(n) if n else b""
        if not raw.strip():
            return {}
        v = json.loads(raw)
        if not isinstance(v, dict):
            raise ValueError("the body must be a JSON object")
        return v

    def client_gone(self):
        """True once the client has closed its side (readable with nothing to read)."""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    # -- routes --------------------------------------------------------------------------

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self.send_body(200, "OK", "text/plain")
        elif path == "/contexts":
            self.send_body(200, [c.json() for c in CONTEXTS.all()])
        else:
            self.send_body(404, "Not Found", "text/plain")

    def do_DELETE(self):
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) == 2 and parts[0] == "contexts":
            ctx = CONTEXTS.remove(parts[1])
            if ctx is None:
                return self.not_found(parts[1])
            with ctx.lock:
                ctx.stop()
            return self.send_empty()
        self.send_body(404, "Not Found", "text/plain")

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        try:
            body = self.read_json()
        except (ValueError, json.JSONDecodeError) as e:
            return self.bad_request(f"invalid JSON body: {e}")
        if path == "/execute":
            return self.execute(body)
        if path == "/contexts":
            language, err = canonical(body.get("language"))
            if err:
                return self.bad_request(err)
            cwd = body.get("cwd") or DEFAULT_CWD
            if not isinstance(cwd, str) or not os.path.isabs(cwd):
                return self.bad_request(f"cwd {cwd!r} must be an absolute path")
            if not os.path.isdir(cwd):
                # A missing working directory is made (as the kernels' user, root), like a
                # shell's `mkdir -p`; one that cannot be is refused with the reason.
                try:
                    os.makedirs(cwd, exist_ok=True)
                except OSError as e:
                    return self.bad_request(f"cwd {cwd!r}: {e.strerror}")
            try:
                ctx = CONTEXTS.create(language, cwd)
            except KernelMissing as e:
                return self.bad_request(str(e))
            except Exception as e:
                return self.send_body(500, f"starting the {language} kernel: {e}", "text/plain")
            return self.send_body(200, ctx.json())
        parts = path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
            ctx = CONTEXTS.get(parts[1])
            if ctx is None:
                return self.not_found(parts[1])
            with ctx.lock:
                try:
                    ctx.restart()
                except Exception as e:
                    return self.send_body(500, f"restarting the kernel: {e}", "text/plain")
            return self.send_empty()
        self.send_body(404, "Not Found", "text/plain")

    def execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            return self.bad_request("`code` (a string) is required")
        cid = body.get("context_id")
        language = body.get("language")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
            return self.bad_request("`env_vars` must map names to strings")
        if cid:
            ctx = CONTEXTS.get(cid)
            if ctx is None:
                return self.not_found(cid)
        else:
            language, err = canonical(language)
            if err:
                return self.bad_request(err)
            try:
                ctx = CONTEXTS.default_context(language)
            except KernelMissing as e:
                return self.bad_request(str(e))
            except Exception as e:
                return self.send_body(500, f"starting the {language} kernel: {e}", "text/plain")
        with ctx.lock:
            if not ctx.alive():
                try:
                    ctx.restart()
                except KernelMissing as e:
                    return self.bad_request(str(e))
                except Exception as e:
                    return self.send_body(500, f"starting a kernel: {e}", "text/plain")
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def emit(obj):
                line = (json.dumps(obj) + "\n").encode()
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                except OSError:
                    raise ClientGone()

            try:
                ctx.execute(code, env_vars, emit, self.client_gone)
                emit({"type": "end_of_execution"})
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except ClientGone:
                # The execution was interrupted (see `Context._execute`).
                self.close_connection = True


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _boot_default(ctx):
    try:
        CONTEXTS.boot(ctx)
    except KernelMissing as e:
        log(f"no default {ctx.language} context: {e}")
    except Exception as e:  # noqa: BLE001 (made again at its first use)
        log(f"starting the default {ctx.language} context: {e}")


def main():
    os.environ["HOME"] = HOME
    # Connection files in a directory of this user (never under another user's home).
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", os.path.join(
        os.environ.get("XDG_RUNTIME_DIR") or "/tmp", f"rampart-jupyter-{os.getuid()}"))
    os.makedirs(os.environ["JUPYTER_RUNTIME_DIR"], mode=0o700, exist_ok=True)
    try:
        CONTEXTS.default_context("python")
    except Exception as e:
        log(f"cannot start the default Python kernel: {e}")
        sys.exit(1)
    # As E2B's: a default JavaScript context too, listed before the server answers (E2B lists
    # both at start) and started in the background meanwhile.
    js, new = CONTEXTS.reserve_default("javascript")
    if new:
        threading.Thread(target=_boot_default, args=(js,), daemon=True).start()
    srv = Server((HOST, PORT), Handler)
    log(f"listening on {HOST}:{PORT}")
    srv.serve_forever()


if __name__ == "__main__":
    main()
