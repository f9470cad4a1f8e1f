//! The kernel's privileged interfaces: mount, new namespaces, module loading, raw sockets.

use super::*;

#[test]
fn sandbox_blocks_mount() {
    let Some(d) = daemon() else { return };
    let sb = sandbox(d);
    let script = r#"
sudo mount -t tmpfs x /mnt 2>&1; echo "mount_tmpfs=$?"
sudo mount --bind /home /mnt 2>&1; echo "mount_bind=$?"
sudo mount -t proc proc /mnt 2>&1; echo "mount_proc=$?"
sudo mount -o remount,rw /usr 2>&1; echo "remount_usr=$?"
sudo umount -l /proc 2>&1; echo "umount_proc=$?"
sudo python3 -c '
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
r = libc.mount(b"x", b"/mnt", b"tmpfs", 0, None)
print("ctypes_mount=%d %s" % (r, errno.errorcode.get(ctypes.get_errno(), "")))
' 2>&1
echo "mnt_mounts=$(awk '$5 == "/mnt"' /proc/self/mountinfo | wc -l)"
"#;
    for user in ["user", "root"] {
        let r = sb.bash(user, script, 60);
        let out = &r.stdout;
        for k in [
            "mount_tmpfs",
            "mount_bind",
            "mount_proc",
            "remount_usr",
            "umount_proc",
        ] {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("{k}=")))
                .unwrap_or_else(|| panic!("no {k} in output:\n{}", show(&r)));
            assert_ne!(
                line,
                format!("{k}=0"),
                "`{k}` succeeded inside (exec user {user}):\n{}",
                show(&r)
            );
        }
        assert!(
            out.contains("ctypes_mount=-1"),
            "mount(2) did not fail (exec user {user}):\n{}",
            show(&r)
        );
        assert!(
            out.contains("mnt_mounts=0"),
            "something got mounted on /mnt (exec user {user}):\n{}",
            show(&r)
        );
        eprintln!("mount attempts as {user}:\n{}", r.stdout);
    }
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_new_user_namespace() {
    let Some(d) = daemon() else { return };
    let sb = sandbox(d);
    let script = r#"
unshare -U true 2>&1; echo "unshare_U=$?"
unshare -Ur true 2>&1; echo "unshare_Ur=$?"
sudo unshare -U true 2>&1; echo "sudo_unshare_U=$?"
sudo unshare -m true 2>&1; echo "sudo_unshare_m=$?"
sudo unshare -n true 2>&1; echo "sudo_unshare_n=$?"
sudo unshare -p -f true 2>&1; echo "sudo_unshare_p=$?"
python3 -c '
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
r = libc.unshare(0x10000000)
print("ctypes_unshare_user=%d %s" % (r, errno.errorcode.get(ctypes.get_errno(), "")))
' 2>&1
"#;
    let r = sb.bash("user", script, 60);
    for k in [
        "unshare_U",
        "unshare_Ur",
        "sudo_unshare_U",
        "sudo_unshare_m",
        "sudo_unshare_n",
        "sudo_unshare_p",
    ] {
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in output:\n{}", show(&r)));
        assert_ne!(
            line,
            format!("{k}=0"),
            "`{k}` succeeded inside:\n{}",
            show(&r)
        );
    }
    assert!(
        r.stdout.contains("ctypes_unshare_user=-1"),
        "unshare(CLONE_NEWUSER) did not fail:\n{}",
        show(&r)
    );
    eprintln!("namespace attempts:\n{}", r.stdout);
    assert_host_healthy(d);
}

const MODULE_PROBE: &str = r#"
import ctypes, errno, json, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nrs = {'x86_64': (175, 313, 176), 'aarch64': (105, 273, 106)}[platform.machine()]
def call(*a):
    r = libc.syscall(*a)
    e = ctypes.get_errno()
    return [r, errno.errorcode.get(e, str(e)) if r != 0 else 'ok']
img = b'\x7fELF' + b'\0' * 60
buf = ctypes.create_string_buffer(img, len(img))
fd = os.open('/dev/null', os.O_RDONLY)
print(json.dumps({
    'init_module': call(ctypes.c_long(nrs[0]), buf, ctypes.c_ulong(len(img)), ctypes.c_char_p(b'')),
    'finit_module': call(ctypes.c_long(nrs[1]), ctypes.c_int(fd), ctypes.c_char_p(b''), ctypes.c_int(0)),
    'delete_module': call(ctypes.c_long(nrs[2]), ctypes.c_char_p(b'rampart_no_such_module'), ctypes.c_uint(0o4000)),
}))
"#;

#[test]
fn sandbox_blocks_module_load() {
    let Some(d) = daemon() else { return };
    let sb = sandbox(d);
    let code = MODULE_PROBE.replace('\'', "'\\''");
    let runs = [
        ("root", sb.py("root", MODULE_PROBE, &[], 30)),
        (
            "sudo",
            sb.bash("user", &format!("sudo python3 -c '{code}'"), 30),
        ),
    ];
    for (who, r) in &runs {
        if r.signal == Some(31) || r.exit_code == Some(128 + 31) {
            eprintln!("{who}: the module probe was killed by SIGSYS (seccomp kill): contained");
            continue;
        }
        assert_eq!(
            r.exit_code,
            Some(0),
            "the module probe failed ({who}):\n{}",
            show(r)
        );
        let v = probe_json(r);
        for k in ["init_module", "finit_module", "delete_module"] {
            assert_eq!(v[k][0], -1, "{k} succeeded inside ({who}):\n{}", show(r));
            let e = v[k][1].as_str().unwrap_or("");
            assert!(
                e == "EPERM" || e == "ENOSYS",
                "{k} inside ({who}) failed with {e}: the kernel looked at the request, so the caller had the privilege \
                 (expected EPERM from the missing capability or the seccomp deny list)\n{}",
                show(r)
            );
        }
        eprintln!("{who}: {v}");
    }
    let r = sb.bash(
        "user",
        "sudo modprobe -q dummy 2>&1; echo \"modprobe=$?\"",
        30,
    );
    assert!(
        !r.stdout.contains("modprobe=0\n"),
        "modprobe succeeded inside:\n{}",
        show(&r)
    );
    assert_host_healthy(d);
}

const RAW_SOCKET_PROBE: &str = r#"
import errno, json, socket
out = {}
for name, args in (
    ('inet_raw_icmp', (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
    ('inet_raw_raw', (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)),
    ('inet6_raw_icmp', (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)),
    ('packet_raw', (socket.AF_PACKET, socket.SOCK_RAW, 0x0300)),
    ('packet_dgram', (socket.AF_PACKET, socket.SOCK_DGRAM, 0x0300)),
):
    try:
        socket.socket(*args).close()
        out[name] = 'created'
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"#;

#[test]
fn sandbox_blocks_raw_sockets() {
    let Some(d) = daemon() else { return };
    let sb = sandbox(d);
    let code = RAW_SOCKET_PROBE.replace('\'', "'\\''");
    let runs = [
        ("user", sb.py("user", RAW_SOCKET_PROBE, &[], 30)),
        ("root", sb.py("root", RAW_SOCKET_PROBE, &[], 30)),
        (
            "sudo",
            sb.bash("user", &format!("sudo python3 -c '{code}'"), 30),
        ),
    ];
    for (who, r) in &runs {
        assert_eq!(
            r.exit_code,
            Some(0),
            "the raw socket probe failed ({who}):\n{}",
            show(r)
        );
        let v = probe_json(r);
        for (k, res) in v.as_object().into_iter().flatten() {
            assert_ne!(
                res,
                "created",
                "a {k} socket was created inside ({who}):\n{}",
                show(r)
            );
        }
        assert_eq!(
            v["inet_raw_icmp"],
            "EPERM",
            "SOCK_RAW/ICMP inside ({who}):\n{}",
            show(r)
        );
        eprintln!("{who}: {v}");
    }
    assert_host_healthy(d);
}
