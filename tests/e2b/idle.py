"""Idle sleep through the E2B face, with the unmodified `e2b` SDK: the daemon under test has
`[e2b] idle_pause_secs = 2`, so every sandbox the E2B API makes sleeps (is paused) after two
seconds without a request, and the SDK's next call wakes it and gets its answer.
"""

from e2b import Sandbox

from harness import run, test, wait_for


def state(sandbox_id):
    return Sandbox.get_info(sandbox_id).state


def asleep(sbx):
    wait_for(lambda: state(sbx.sandbox_id) == "paused", timeout=60, what="the sandbox to sleep")


@test
def a_command_wakes_a_sleeping_sandbox():
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.commands.run("echo awake > /tmp/mark")
        asleep(sbx)
        r = sbx.commands.run("cat /tmp/mark")
        assert r.stdout == "awake\n", r
        assert state(sbx.sandbox_id) == "running"
    finally:
        sbx.kill()


@test
def a_file_call_wakes_it_and_a_background_command_survives_the_sleep():
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/tmp/data.txt", "kept across the sleep")
        h = sbx.commands.run("sleep 600", background=True)
        # An attached handle is an open stream, which keeps the sandbox awake: let go of it.
        h.disconnect()
        asleep(sbx)
        assert sbx.files.read("/tmp/data.txt") == "kept across the sleep"
        # Its processes were frozen, not ended: the background command still runs.
        pids = [p.pid for p in sbx.commands.list()]
        assert h.pid in pids, (h.pid, pids)
    finally:
        sbx.kill()


@test
def a_streamed_command_keeps_it_awake():
    sbx = Sandbox.create(timeout=300)
    try:
        out = []
        r = sbx.commands.run("for i in 1 2 3 4; do echo $i; sleep 1; done",
                             on_stdout=lambda line: out.append(line))
        # Four seconds of output with a two-second idle time: it stayed awake throughout.
        assert r.exit_code == 0 and "".join(out).split() == ["1", "2", "3", "4"], (r, out)
        assert state(sbx.sandbox_id) == "running"
    finally:
        sbx.kill()


if __name__ == "__main__":
    run()
