"""The E2B face of the gVisor tier, with the unmodified `e2b` SDK, against a daemon whose
sandboxes run on gVisor by default (`default_isolation = "gvisor"`): a paused sandbox keeps
its processes across connect, and a snapshot (the SDK's default, or mode="full") keeps them
too: a sandbox made from it continues them.
"""

from e2b import Sandbox

from harness import run, test, wait_for

COUNTER = ("nohup sh -c 'echo $$ > /tmp/pid; i=0; while :; do i=$((i+1)); "
           "echo $i > /tmp/n.t; mv /tmp/n.t /tmp/n; sleep 0.05; done' >/dev/null 2>&1 &")


def count(sbx):
    r = sbx.commands.run("cat /tmp/n 2>/dev/null || echo 0")
    return int(r.stdout.strip() or "0")


def alive(sbx, pid):
    return sbx.commands.run(f"kill -0 {pid} && echo yes || echo no").stdout.strip() == "yes"


def create():
    # No network yet on this tier: E2B's default internet access is asked off.
    return Sandbox.create(timeout=300, allow_internet_access=False)


@test
def a_paused_sandbox_continues_its_processes_after_connect():
    sbx = create()
    try:
        sbx.commands.run(COUNTER)
        wait_for(lambda: count(sbx) > 2, timeout=60, what="the counter")
        pid = sbx.commands.run("cat /tmp/pid").stdout.strip()
        before = count(sbx)
        assert sbx.pause() is True
        assert not sbx.is_running()
        c = Sandbox.connect(sbx.sandbox_id)
        assert alive(c, pid)
        assert count(c) >= before
        wait_for(lambda: count(c) > before, timeout=60, what="the counter to go on")
    finally:
        sbx.kill()


@test
def a_snapshot_of_a_gvisor_sandbox_keeps_its_processes():
    src = create()
    made = None
    try:
        src.commands.run(COUNTER)
        wait_for(lambda: count(src) > 2, timeout=60, what="the counter")
        pid = src.commands.run("cat /tmp/pid").stdout.strip()
        snap = src.create_snapshot()
        made = Sandbox.create(template=snap.snapshot_id, timeout=120, allow_internet_access=False)
        assert made.sandbox_id != src.sandbox_id
        assert alive(made, pid), "the snapshot's process does not run in the new sandbox"
        at = count(made)
        wait_for(lambda: count(made) > at, timeout=60, what="the restored counter to go on")
        # The source runs on too.
        assert alive(src, pid)
    finally:
        for s in (made, src):
            if s is not None:
                s.kill()


if __name__ == "__main__":
    run()
