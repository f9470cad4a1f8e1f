"""The E2B drop-in's last mile (issue 31, items 1-4 and 6) through the unmodified Python SDK
(`e2b==2.63.0`) against a Rampart daemon; item 5, the code interpreter's, is
`last_mile_ci.py`.

Configured only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. Each test is a behaviour a
program written for E2B sees:

1. files the kernel generates (procfs: size 0) read to their end;
2. a sandbox reads a boot id of its own, new at each boot (create, a resume from its disk, a
   fork), never the host's, and the same one all through a boot (a frozen pause is no boot);
3. `Template.exists` knows the built-in templates by E2B's names;
4. a sandbox killed while a command streams raises the SDK's "killed or reached its end of
   life" error;
6. a write to a path whose parent directories are missing makes them (owned by the user).

`python3 last_mile.py [test names...]`: prints `PASS name` / `FAIL name: why` and `SUMMARY`.
Nothing here waits on time: every wait is on an event, with a deadline.
"""

import re
import threading
import uuid

from harness import run, test
from e2b import Sandbox, Template
from e2b.exceptions import SandboxNotRunningException

RUN = "lm" + uuid.uuid4().hex[:10]
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n$")


def host_boot_id():
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read()


def boot_id(s):
    """The sandbox's boot id, read through the file API (item 1 makes it non-empty) and
    checked against what a process inside reads."""
    via_files = s.files.read("/proc/sys/kernel/random/boot_id")
    via_cat = s.commands.run("cat /proc/sys/kernel/random/boot_id").stdout
    assert via_files == via_cat, (via_files, via_cat)
    assert UUID.match(via_files), repr(via_files)
    return via_files


# -- 1. procfs and sysfs files ----------------------------------------------------------------


@test
def files_the_kernel_makes_read_to_their_end():
    s = Sandbox.create(metadata={"suite": RUN}, timeout=300)
    try:
        for path in ["/proc/sys/kernel/random/boot_id", "/proc/meminfo", "/proc/self/status",
                     "/proc/version"]:
            text = s.files.read(path)
            assert text, f"{path} read as empty"
        assert "MemTotal:" in s.files.read("/proc/meminfo")
        raw = s.files.read("/proc/version", format="bytes")
        assert bytes(raw) == s.commands.run("cat /proc/version").stdout.encode(), raw
        # A sysfs file, where this kernel has one to read.
        probe = s.commands.run("for f in /sys/kernel/mm/transparent_hugepage/enabled "
                               "/sys/devices/system/cpu/online; do "
                               "[ -r $f ] && { echo $f; break; }; done")
        sysfs = probe.stdout.strip()
        if sysfs:
            want = s.commands.run(f"cat {sysfs}").stdout
            assert want and s.files.read(sysfs) == want, sysfs
        # A file that really is empty is still empty.
        s.files.write(f"/home/user/empty-{RUN}", "")
        assert s.files.read(f"/home/user/empty-{RUN}") == ""
    finally:
        s.kill()


# -- 2. a boot id per boot --------------------------------------------------------------------


@test
def each_boot_has_its_own_boot_id():
    host = host_boot_id()
    a = Sandbox.create(metadata={"suite": RUN}, timeout=300)
    b = Sandbox.create(metadata={"suite": RUN}, timeout=300)
    forks = []
    try:
        ida, idb = boot_id(a), boot_id(b)
        assert ida != host and idb != host, "a sandbox reads the host's boot id"
        assert ida != idb, "two sandboxes share a boot id"
        # The same all through a boot, also across a pause that keeps the memory.
        assert boot_id(a) == ida
        assert a.pause() is True
        a = Sandbox.connect(a.sandbox_id)
        assert boot_id(a) == ida, "a frozen pause changed the boot id"
        # A resume from the disk is a boot.
        assert a.pause(mode="filesystem") is True
        a = Sandbox.connect(a.sandbox_id)
        again = boot_id(a)
        assert again not in (ida, idb, host), "a boot from the disk kept a boot id"
        # So is a fork, and the source keeps its own.
        forks = a.fork(count=1, timeout=300)
        assert len(forks) == 1 and isinstance(forks[0], Sandbox), forks
        forked = boot_id(forks[0])
        assert forked not in (ida, idb, again, host), "a fork kept a boot id"
        assert boot_id(a) == again
    finally:
        for s in [a, b, *forks]:
            if isinstance(s, Sandbox):
                s.kill()


# -- 3. the built-in templates by E2B's names -------------------------------------------------


@test
def builtin_templates_exist_under_e2b_names():
    for name in ["base", "code-interpreter-v1", "code-interpreter"]:
        assert Template.exists(name), name
        assert Template.alias_exists(name), name
    assert not Template.exists(f"no-such-template-{RUN}")


# -- 4. killed while a command streams --------------------------------------------------------


@test
def killed_while_a_command_streams():
    s = Sandbox.create(metadata={"suite": RUN}, timeout=300)
    started = threading.Event()

    def killer():
        if started.wait(120):
            Sandbox.kill(s.sandbox_id)

    threading.Thread(target=killer, daemon=True).start()
    try:
        s.commands.run("echo up; sleep 600", on_stdout=lambda _: started.set(), timeout=0)
    except SandboxNotRunningException as e:
        assert "killed or reached its end of life" in str(e), e
    else:
        raise AssertionError("the command outlived its sandbox")
    assert started.is_set()


# -- 6. writes make their parent directories --------------------------------------------------


@test
def a_write_makes_missing_parents_anywhere():
    s = Sandbox.create(metadata={"suite": RUN}, timeout=300)
    try:
        path = f"/{RUN}/deeper/a.txt"
        info = s.files.write(path, "made")
        assert info.path == path, info
        assert s.files.read(path) == "made"
        owners = s.commands.run(f"stat -c '%U:%G %a' /{RUN} /{RUN}/deeper {path}").stdout
        assert owners.split("\n")[:3] == ["user:user 755", "user:user 755", "user:user 644"], owners
        # An existing directory the user may not write into stays refused.
        try:
            s.files.write(f"/root/{RUN}.txt", "no")
        except Exception as err:  # noqa: BLE001 - the SDK's permission error
            assert "ermission" in str(err), err
        else:
            raise AssertionError("a user wrote into /root")
        # A parent that is a file is refused.
        try:
            s.files.write("/etc/hostname/x.txt", "no")
        except Exception as err:  # noqa: BLE001
            assert "hostname" in str(err), err
        else:
            raise AssertionError("a write went under a file")
    finally:
        s.kill()


if __name__ == "__main__":
    run()
