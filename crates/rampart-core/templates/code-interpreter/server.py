#!/usr/bin/python3
"""Rampart's code interpreter: E2B's code-interpreter HTTP API over IPython kernels.

Runs inside a sandbox of the `code-interpreter-v1` template, as `user`, started by the daemon
right after the sandbox's agent answers. Listens on 127.0.0.1:49999 (the daemon reaches it
through the agent's port tunnel) once the default Python context's kernel is ready.

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
during an execution (the SDK's timeout) interrupts it. Only Python is served.

Standard library plus jupyter_client (Debian's python3-jupyter-client / python3-ipykernel).
"""

import base64
import datetime
import http.server
import json
import os
import queue
import select
import socket
import sys
import threading
import time
import uuid

from jupyter_client.manager import KernelManager

HOST = "127.0.0.1"
PORT = int(os.environ.get("RAMPART_CODE_INTERPRETER_PORT", "49999"))
DEFAULT_CWD = os.environ.get("HOME", "/home/user")
KEEPALIVE_SECS = 5.0
KERNEL_READY_SECS = 60.0
LANGUAGES = ("python", "python3")

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
}


def log(msg):
    sys.stderr.write(f"code-interpreter: {msg}\n")
    sys.stderr.flush()


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class ClientGone(Exception):
    """The HTTP client closed its connection."""


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
        km = KernelManager(kernel_name="python3")
        km.start_kernel(cwd=self.cwd)
        kc = km.blocking_client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=KERNEL_READY_SECS)
        except Exception:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        self.km, self.kc = km, kc

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
            self.run_silent(
                "import os as __rampart_os\n"
                f"__rampart_os.environ.update({json.dumps(env_vars)!s})\n"
                "del __rampart_os\n"
            )
            self.drain()
        try:
            self._execute(code, emit, client_gone)
        finally:
            if env_vars and self.alive():
                # Put back what the variables were in the server (the kernel's start env).
                code = "import os as __rampart_os\n"
                for k, v in restore.items():
                    if v is None:
                        code += f"__rampart_os.environ.pop({json.dumps(k)}, None)\n"
                    else:
                        code += f"__rampart_os.environ[{json.dumps(k)}] = {json.dumps(v)}\n"
                code += "del __rampart_os\n"
                self.run_silent(code)
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
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
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
                out = result_of(c.get("data", {}), True)
            elif t == "display_data":
                out = result_of(c.get("data", {}), False)
            elif t == "error":
                out = {
                    "type": "error",
                    "name": c.get("ename", ""),
                    "value": c.get("evalue", ""),
                    "traceback": "\n".join(c.get("traceback", [])),
                }
            elif t == "execute_input":
                count = c.get("execution_count")
            elif t == "status" and c.get("execution_state") == "idle":
                idle = True
            if out is not None:
                emit(out)
                last_sent = time.monotonic()
        return count

    def interrupt(self, msg_id):
        """Interrupts the running execution and waits (bounded) for the kernel to be idle;
        restarts the kernel if it does not get there."""
        try:
            self.km.interrupt_kernel()
        except Exception as e:
            log(f"interrupting {self.id}: {e}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
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


def result_of(data, is_main):
    out = {"type": "result", "is_main_result": is_main}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        else:
            out[field] = value
    if extra:
        out["extra"] = extra
    return out


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.default = None

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
            if ctx is not None and self.default is ctx:
                self.default = None
        return ctx

    def all(self):
        with self.lock:
            return list(self.by_id.values())

    def default_context(self):
        with self.lock:
            d = self.default
        if d is not None:
            return d
        d = self.create("python", DEFAULT_CWD)
        with self.lock:
            if self.default is None:
                self.default = d
                return d
            other = self.default
        # Another request made one meanwhile.
        self.remove(d.id)
        d.stop()
        return other


CONTEXTS = Contexts()


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
            language = body.get("language") or "python"
            if language not in LANGUAGES:
                return self.bad_request(
                    f"language {language!r} is not supported: this interpreter runs python")
            cwd = body.get("cwd") or DEFAULT_CWD
            if not os.path.isdir(cwd):
                return self.bad_request(f"cwd {cwd!r} is not a directory")
            try:
                ctx = CONTEXTS.create("python", cwd)
            except Exception as e:
                return self.send_body(500, f"starting a kernel: {e}", "text/plain")
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
            if language and language not in LANGUAGES:
                return self.bad_request(
                    f"language {language!r} is not supported: this interpreter runs python")
            try:
                ctx = CONTEXTS.default_context()
            except Exception as e:
                return self.send_body(500, f"starting a kernel: {e}", "text/plain")
        with ctx.lock:
            if not ctx.alive():
                try:
                    ctx.restart()
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


def main():
    try:
        CONTEXTS.default_context()
    except Exception as e:
        log(f"cannot start the default Python kernel: {e}")
        sys.exit(1)
    srv = Server((HOST, PORT), Handler)
    log(f"listening on {HOST}:{PORT}")
    srv.serve_forever()


if __name__ == "__main__":
    main()
