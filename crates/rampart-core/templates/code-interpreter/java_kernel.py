#!/usr/bin/python3
"""A Jupyter kernel for Java over JShell (the JDK's `jshell`), for Rampart's code interpreter.

A wrapper kernel on ipykernel's `Kernel` class: it drives `JShellBridge.java` (next to this
file, run by the JDK's source launcher) as a subprocess, which keeps one JShell whose snippets
run in a JVM of their own, so state persists across executions. Per execution: the snippets'
System.out/System.err stream as they are written, the value of a last expression is the
result (`text/plain`; a String as its text), an exception is an `error` (its class, message
and stack trace), a snippet that does not compile an error `CompilationException`. An
interrupt (SIGINT) stops the running snippet and keeps the state.

    python3 java_kernel.py -f CONNECTION_FILE

Besides Java, one line is understood: `%rampart-env {"NAME": "value" | null, ...}` sets (or,
for null, removes) environment variables of the snippets' JVM (`System.getenv`, and the system
property of the same name, which is where E2B's Java kernel puts them); the code interpreter
sends it around an execution with `env_vars`. The JVM's environment at start is in its system
properties too.

A line the snippets print (`System.out.println("x")`) streams as its text and then its newline,
two chunks, as E2B's Java kernel sends it (the SDK's `logs.stdout[0]` is `x`).

Needs: Debian's python3-ipykernel and a JDK with jdk.jshell (default-jdk-headless).
"""

import base64
import hashlib
import json
import os
import queue
import shutil
import subprocess
import threading

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

HERE = os.path.dirname(os.path.abspath(__file__))
BRIDGE = os.path.join(HERE, "JShellBridge.java")
ENV_MAGIC = "%rampart-env "
READY_SECS = 120
# The bridge's JVM compiles the snippets (javac inside JShell); the snippets' own JVM keeps the
# JDK's defaults but for its collector. Small and serial: a sandbox runs several kernels.
BRIDGE_JVM = ["-Xmx160m", "-Xss1m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
              "-Xshare:auto"]


def b64(s):
    return base64.b64encode(s.encode()).decode()


def unb64(s):
    return base64.b64decode(s).decode("utf-8", "replace")


class BridgeDied(Exception):
    pass


def compiled_bridge():
    """The directory holding JShellBridge.class, compiled once per user and source (in
    ~/.cache); None when javac is missing (the source launcher is used then)."""
    javac = shutil.which("javac")
    if javac is None:
        return None
    with open(BRIDGE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    out = os.path.join(cache, "rampart-java-kernel", digest)
    if os.path.isfile(os.path.join(out, "JShellBridge.class")):
        return out
    tmp = f"{out}.tmp{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    r = subprocess.run([javac, "-J-Xmx192m", "-J-XX:+UseSerialGC", "-nowarn", "-d", tmp, BRIDGE],
                       capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BridgeDied(f"compiling the JShell bridge failed: {r.stderr.strip()}")
    try:
        os.rename(tmp, out)
    except OSError:  # another kernel compiled it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return out


class Bridge:
    """The JShellBridge subprocess and a thread reading its lines into a queue."""

    def __init__(self):
        java = shutil.which("java") or "/usr/bin/java"
        classes = compiled_bridge()
        main = ["-cp", classes, "JShellBridge"] if classes else [BRIDGE]
        # A session of its own: a SIGINT the kernel manager sends the kernel's process group
        # must not end the JVMs (the kernel turns it into a STOP).
        self.proc = subprocess.Popen(
            [java, *BRIDGE_JVM, "--add-modules", "jdk.jshell", *main],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
            start_new_session=True, bufsize=0,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        kind, _ = self.next(READY_SECS)
        if kind != "READY":
            raise BridgeDied(f"JShell did not start (got {kind})")

    def _read(self):
        for raw in self.proc.stdout:
            parts = raw.decode().rstrip("\n").split(" ")
            self.lines.put((parts[0], [unb64(p) for p in parts[1:]]))
        self.lines.put(("EOF", []))

    def next(self, timeout=None):
        try:
            kind, fields = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise BridgeDied("JShell did not answer in time")
        if kind == "EOF":
            raise BridgeDied(f"JShell exited ({self.proc.wait()})")
        return kind, fields

    def send(self, *words):
        try:
            self.proc.stdin.write((" ".join(words) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:
            raise BridgeDied(f"JShell is gone: {e}")

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def java_version():
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        first = (out.stderr or out.stdout).splitlines()[0]
        return first.split('"')[1] if '"' in first else first
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return ""


class JavaKernel(Kernel):
    implementation = "rampart-java"
    implementation_version = "1.0"
    language = "java"
    banner = "Java (JShell), Rampart's kernel"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.language_info = {
            "name": "java",
            "version": java_version(),
            "mimetype": "text/x-java-source",
            "file_extension": ".java",
            "codemirror_mode": "java",
        }
        self.bridge = Bridge()

    def _stream(self, name, text):
        # A printed line is its text, then its newline (as E2B's Java kernel streams it).
        parts = [text[:-1], "\n"] if len(text) > 1 and text.endswith("\n") else [text]
        for part in parts:
            self.send_response(self.iopub_socket, "stream", {"name": name, "text": part})

    def _run(self, words, silent):
        """Sends one job and follows it to DONE; returns (value, error) where error is
        (ename, evalue, traceback lines) or None."""
        self.bridge.send(*words)
        value, error, stopping = None, None, False
        while True:
            try:
                kind, f = self.bridge.next()
            except KeyboardInterrupt:
                if not stopping:
                    self.bridge.send("STOP")
                    stopping = True
                continue
            if kind == "DONE":
                return value, error
            if kind in ("OUT", "ERR"):
                if not silent:
                    self._stream("stdout" if kind == "OUT" else "stderr", f[0])
            elif kind == "VALUE":
                value = f[0]
            elif kind == "EXC":
                name, msg, trace = f
                if stopping and not msg:
                    msg = "interrupted"
                error = (name.rsplit(".", 1)[-1], msg, trace.rstrip("\n").split("\n"))
            elif kind == "DIAG":
                error = ("CompilationException", f[0], f[0].split("\n"))
        # not reached

    def do_execute(self, code, silent, store_history=True, user_expressions=None,
                   allow_stdin=False, *, cell_id=None):
        try:
            if code.startswith(ENV_MAGIC):
                for name, val in json.loads(code[len(ENV_MAGIC):]).items():
                    if val is None:
                        self._run(["UNSET", b64(name)], True)
                    else:
                        self._run(["ENV", b64(name), b64(str(val))], True)
                value, error = None, None
            else:
                value, error = self._run(["EVAL", b64(code)], silent)
        except BridgeDied as e:
            error = ("DeadKernelError", str(e), [f"DeadKernelError: {e}"])
            value = None
            # The kernel is of no use without JShell: end it, the interpreter restarts it.
            threading.Timer(0.5, lambda: os._exit(1)).start()
        if error is not None:
            ename, evalue, tb = error
            if not silent:
                self.send_response(self.iopub_socket, "error",
                                   {"ename": ename, "evalue": evalue, "traceback": tb})
            return {"status": "error", "execution_count": self.execution_count,
                    "ename": ename, "evalue": evalue, "traceback": tb}
        if value is not None and not silent:
            self.send_response(self.iopub_socket, "execute_result", {
                "execution_count": self.execution_count,
                "data": {"text/plain": value},
                "metadata": {},
            })
        return {"status": "ok", "execution_count": self.execution_count,
                "payload": [], "user_expressions": {}}

    def do_is_complete(self, code):
        return {"status": "unknown"}

    def do_shutdown(self, restart):
        self.bridge.close()
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=JavaKernel)
