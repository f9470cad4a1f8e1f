"""The code interpreter's bash kernel: PyPI's bash_kernel, with stderr kept apart.

bash_kernel runs bash on a terminal (pexpect), where stdout and stderr are one stream. Here
each cell runs as `{ CELL\n} 2>FIFO`: what its commands (and the background jobs they start)
write to stderr goes to a FIFO this kernel reads, and is published as the `stderr` stream;
bash's own prompt and messages stay on the terminal, which bash_kernel needs. The cell's
state (variables, functions, cwd) is kept as before: a brace group runs in the shell itself.
After a cell a marker written to the FIFO tells when all of its stderr has been read.
"""

import os
import secrets
import tempfile
import threading

from bash_kernel.kernel import BashKernel

# Written after each cell (by printf, from printable text: a control character typed on the
# terminal would be taken by it); random per kernel, so no output can forge it.
MARK_ID = "rampart-end-of-cell-" + secrets.token_hex(8)
MARK = "\x1e" + MARK_ID + "\x1e"


class RampartBashKernel(BashKernel):
    implementation = "rampart_bash_kernel"

    def _start_bash(self):
        super()._start_bash()
        self._err_lock = threading.Lock()
        self._err_buf = ""
        self._err_mark = threading.Event()
        d = tempfile.mkdtemp(prefix="rampart-bash-")
        self._fifo = os.path.join(d, "stderr")
        os.mkfifo(self._fifo, 0o600)
        # The read end first (a writer's open would block without one), kept open for good.
        fd = os.open(self._fifo, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(fd, True)
        # A writer of our own keeps the FIFO from reporting end-of-file between cells.
        self._keep = os.open(self._fifo, os.O_WRONLY)
        threading.Thread(target=self._read_stderr, args=(fd,), daemon=True).start()

    def _read_stderr(self, fd):
        while True:
            try:
                b = os.read(fd, 65536)
            except OSError:
                return
            if not b:
                return
            text = b.decode("utf-8", "replace")
            with self._err_lock:
                self._err_buf += text
                if MARK in self._err_buf:
                    self._err_mark.set()

    def _flush_stderr(self, upto_mark=False):
        """Publishes what stderr gave so far (from the kernel's own thread: the iopub socket
        is not shared with the reader)."""
        with self._err_lock:
            text = self._err_buf
            if upto_mark and MARK in text:
                text, _, rest = text.partition(MARK)
                self._err_buf = rest
                self._err_mark.clear()
            else:
                self._err_buf = ""
        if text and not self.silent:
            self.send_response(self.iopub_socket, "stream", {"name": "stderr", "text": text})

    def process_output(self, output):
        self._flush_stderr()
        super().process_output(output)

    def send_response(self, stream, msg_type, content=None, *args, **kwargs):
        # A failed cell's `error` (its exit status) goes after the cell's stderr.
        held = getattr(self, "_held", None)
        if held is not None and msg_type == "error":
            held.append((stream, msg_type, content, args, kwargs))
            return None
        return super().send_response(stream, msg_type, content, *args, **kwargs)

    def do_execute(self, code, silent, store_history=True, user_expressions=None,
                   allow_stdin=False):
        if not code.strip() or code.strip().endswith("\\"):
            return super().do_execute(code, silent, store_history, user_expressions, allow_stdin)
        fifo = self._fifo.replace("'", "'\\''")
        wrapped = "{ " + code.rstrip() + "\n} 2>'" + fifo + "'"
        self._held = []
        try:
            reply = super().do_execute(wrapped, silent, store_history, user_expressions,
                                       allow_stdin)
            # Everything the cell wrote to stderr is read once the marker is.
            self.bashwrapper.run_command("printf '\\036" + MARK_ID + "\\036' >'" + fifo + "'")
            self._err_mark.wait(timeout=5)
            self._flush_stderr(upto_mark=True)
        finally:
            held, self._held = self._held, None
            for stream, msg_type, content, args, kwargs in held:
                super().send_response(stream, msg_type, content, *args, **kwargs)
        return reply


if __name__ == "__main__":
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=RampartBashKernel)
