//! Host processes: `/proc` views of them (environment, command line, kcore, sysrq, keys),
//! ptrace and kill from inside.

use super::*;
use std::process::{Child, Command, Stdio};

/// A host process started by a test; killed by pid on drop.
struct HostProc(Child);

impl HostProc {
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for HostProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const PROC_PROBE: &str = r#"
import errno, json, os, sys
secrets = [a[::-1].encode() for a in sys.argv[1:3]]
hp = int(sys.argv[3])
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
hits, cmdlines = [], {}
for p in pids:
    for f in ('environ', 'cmdline'):
        try:
            data = open('/proc/%d/%s' % (p, f), 'rb').read()
        except OSError:
            continue
        if f == 'cmdline':
            cmdlines[p] = data.replace(b'\0', b' ').decode(errors='replace')
        for s in secrets:
            if s in data:
                hits.append('%d/%s' % (p, f))
def err(fn):
    try:
        fn()
        return 'ok'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
kill0 = err(lambda: os.kill(hp, 0))
def kcore():
    with open('/proc/kcore', 'rb') as f:
        if f.read(16):
            return
    raise OSError(errno.ENODATA, 'empty')
def sysrq():
    with open('/proc/sysrq-trigger', 'w') as f:
        f.write('h')
def agent_environ():
    with open('/proc/1/environ', 'rb') as f:
        f.read()
def keys():
    with open('/proc/keys') as f:
        if f.read():
            return
    raise OSError(errno.ENODATA, 'empty')
try:
    proc1_root = os.readlink('/proc/1/root')
except OSError as e:
    proc1_root = errno.errorcode.get(e.errno, str(e.errno))
try:
    proc1_root_is_root = sorted(os.listdir('/proc/1/root')) == sorted(os.listdir('/'))
except OSError as e:
    proc1_root_is_root = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({
    'pids': pids, 'hits': hits, 'cmdlines': cmdlines, 'kill0': kill0,
    'proc1_root': proc1_root, 'proc1_root_is_root': proc1_root_is_root,
    'env_has_secret': any(s.decode() in ''.join(os.environ.values()) for s in secrets),
    'kcore': err(kcore), 'sysrq': err(sysrq), 'keys': err(keys),
    'agent_environ': err(agent_environ),
}))
"#;

#[test]
fn sandbox_blocks_proc_view_of_host_processes() {
    let Some(d) = daemon() else { return };
    let secret = format!("RAMPART-HOST-PROC-ENV-{}", token());
    let marker = format!("600.{}", digits());
    let host = HostProc(
        Command::new("sleep")
            .arg(&marker)
            .env("RAMPART_ADV_PROC_SECRET", &secret)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn host sleep"),
    );
    let hp = host.pid();
    let sb = sandbox(d);
    for user in ["user", "root"] {
        let r = sb.py(
            user,
            PROC_PROBE,
            // Reversed, so that the probe's own argv does not hold the secrets.
            &[
                secret.chars().rev().collect(),
                env_secret().chars().rev().collect(),
                hp.to_string(),
            ],
            60,
        );
        assert_eq!(
            r.exit_code,
            Some(0),
            "the /proc probe failed as {user}:\n{}",
            show(&r)
        );
        let v = probe_json(&r);
        assert!(
            !r.stdout.contains(&secret) && !r.stdout.contains(env_secret()),
            "a host process's environment is readable inside (as {user}):\n{}",
            show(&r)
        );
        assert_eq!(
            v["hits"],
            serde_json::json!([]),
            "host secrets found in /proc/*/environ|cmdline inside as {user}:\n{}",
            show(&r)
        );
        assert_eq!(
            v["env_has_secret"],
            false,
            "the daemon's environment leaked into the sandbox (as {user}):\n{}",
            show(&r)
        );
        let pids: Vec<i64> = v["pids"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default();
        assert!(
            pids.contains(&1),
            "no PID 1 in the sandbox's /proc: {pids:?}"
        );
        assert!(
            pids.len() < 40,
            "the sandbox sees {} processes; only its own should be visible: {pids:?}",
            pids.len()
        );
        let cmds = v["cmdlines"].to_string();
        assert!(
            !cmds.contains(&marker),
            "the host process `sleep {marker}` is visible inside (as {user}): {cmds}"
        );
        if !pids.contains(&(hp as i64)) {
            assert_eq!(
                v["kill0"], "ESRCH",
                "kill(host pid {hp}, 0) from inside as {user}: {}",
                v["kill0"]
            );
        }
        // The agent (PID 1) is non-dumpable by design, so /proc/1/root may be refused
        // (EACCES) to anyone inside; where it resolves, it must be the sandbox's own root.
        let p1 = v["proc1_root"].as_str().unwrap_or("");
        let p1_ok = p1 == "/" || p1.starts_with('E');
        assert!(
            p1_ok,
            "/proc/1/root inside is {p1:?}, not the sandbox root:\n{}",
            show(&r)
        );
        let same = &v["proc1_root_is_root"];
        let same_ok = *same == true || same.is_string();
        assert!(
            same_ok,
            "/proc/1/root lists differently from / ({same}):\n{}",
            show(&r)
        );
        assert_ne!(
            v["agent_environ"], "ok",
            "the agent's /proc/1/environ is readable inside as {user}"
        );
        assert_ne!(v["kcore"], "ok", "/proc/kcore is readable inside as {user}");
        assert_ne!(
            v["sysrq"], "ok",
            "/proc/sysrq-trigger is writable inside as {user}"
        );
        assert_ne!(v["keys"], "ok", "/proc/keys shows keys inside as {user}");
        eprintln!(
            "as {user}: pids {pids:?}, kill0 {}, kcore {}, sysrq {}, keys {}",
            v["kill0"], v["kcore"], v["sysrq"], v["keys"]
        );
    }
    assert!(process_alive(hp), "the host process {hp} died");
    assert_host_healthy(d);
}

const PTRACE_PROBE: &str = r#"
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
hp = int(sys.argv[1])
out = {}
for name, req in (('attach', 16), ('seize', 0x4206)):
    r = libc.ptrace(req, hp, None, None)
    e = ctypes.get_errno()
    out[name] = [r, errno.errorcode.get(e, str(e)) if r != 0 else 'ok']
try:
    os.kill(hp, 9)
    out['kill'] = 'ok'
except OSError as ex:
    out['kill'] = errno.errorcode.get(ex.errno, str(ex.errno))
print(json.dumps(out))
"#;

#[test]
fn sandbox_blocks_ptrace_of_host_process() {
    let Some(d) = daemon() else { return };
    let host = HostProc(
        Command::new("sleep")
            .arg(format!("600.{}", digits()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn host sleep"),
    );
    let hp = host.pid();
    let sb = sandbox(d);
    // As the default user, as root (the exec's user), and via sudo.
    let runs = [
        ("user", sb.py("user", PTRACE_PROBE, &[hp.to_string()], 30)),
        ("root", sb.py("root", PTRACE_PROBE, &[hp.to_string()], 30)),
        ("sudo", {
            let code = PTRACE_PROBE.replace('\'', "'\\''");
            sb.bash("user", &format!("sudo python3 -c '{code}' {hp}"), 30)
        }),
    ];
    for (who, r) in &runs {
        assert_eq!(
            r.exit_code,
            Some(0),
            "the ptrace probe failed ({who}):\n{}",
            show(r)
        );
        let v = probe_json(r);
        for k in ["attach", "seize"] {
            assert_eq!(
                v[k][0],
                -1,
                "ptrace {k} of host pid {hp} succeeded ({who}):\n{}",
                show(r)
            );
            let e = v[k][1].as_str().unwrap_or("");
            assert!(e == "ESRCH" || e == "EPERM", "ptrace {k} of host pid {hp} ({who}) failed with {e}, expected ESRCH (pid not visible) or EPERM");
        }
        assert_ne!(
            v["kill"], "ok",
            "kill -9 of host pid {hp} from inside ({who}) succeeded"
        );
        eprintln!("{who}: {v}");
    }
    assert!(
        process_alive(hp),
        "the host process {hp} was killed from inside"
    );
    assert_eq!(
        status_field(hp, "TracerPid").as_deref(),
        Some("0"),
        "the host process {hp} is being traced"
    );
    assert_host_healthy(d);
}
