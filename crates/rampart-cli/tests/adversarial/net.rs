//! The host's network services: listeners on loopback and the host's address, the daemon's
//! API, cloud metadata.

use super::*;
use std::io::Write as _;
use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A listener on the host that counts connections.
struct HostListener {
    addr: std::net::SocketAddr,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostListener {
    fn bind(ip: &str) -> std::io::Result<HostListener> {
        let l = TcpListener::bind(format!("{ip}:0"))?;
        l.set_nonblocking(true)?;
        let addr = l.local_addr()?;
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((mut c, _)) => {
                        h.fetch_add(1, Ordering::SeqCst);
                        let _ = c.write_all(b"HOST-LISTENER-REACHED\n");
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(HostListener {
            addr,
            hits,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for HostListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The host's first global IPv4 address, if any.
fn host_global_ipv4() -> Option<String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout).to_string();
    s.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        it.position(|w| w == "inet")?;
        it.next()?.split('/').next().map(String::from)
    })
}

const CONNECT_PROBE: &str = r#"
import errno, json, socket, sys
out = {}
for t in sys.argv[1:]:
    host, port = t.rsplit(':', 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        out[t] = 'connected'
    except socket.timeout:
        out[t] = 'timeout'
    except OSError as e:
        out[t] = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
print(json.dumps(out))
"#;

#[test]
fn sandbox_blocks_reaching_host_ports() {
    let Some(d) = daemon() else { return };
    let mut listeners = vec![HostListener::bind("127.0.0.1").expect("bind 127.0.0.1")];
    match host_global_ipv4() {
        Some(ip) => {
            listeners.push(HostListener::bind(&ip).unwrap_or_else(|e| panic!("bind {ip}: {e}")))
        }
        None => eprintln!("note: the host has no global IPv4 address; only loopback is tried"),
    }
    let mut targets: Vec<String> = listeners.iter().map(|l| l.addr.to_string()).collect();
    targets.push(format!("127.0.0.1:{}", d.port)); // the daemon's own API
    if let Some(ip) = host_global_ipv4() {
        targets.push(format!("{ip}:{}", d.port));
    }
    targets.push("169.254.169.254:80".into()); // cloud metadata
    let sb = sandbox(d);
    for user in ["user", "root"] {
        let r = sb.py(user, CONNECT_PROBE, &targets, 60);
        assert_eq!(
            r.exit_code,
            Some(0),
            "the connect probe failed ({user}):\n{}",
            show(&r)
        );
        let v = probe_json(&r);
        for t in &targets {
            assert!(v[t].is_string(), "no result for {t}:\n{}", show(&r));
            assert_ne!(
                v[t],
                "connected",
                "connected from inside to host {t} ({user}):\n{}",
                show(&r)
            );
        }
        eprintln!("{user}: {v}");
    }
    let r = sb.bash(
        "user",
        &format!(
            "curl -sS -m 3 http://127.0.0.1:{}/health 2>&1; echo \"curl=$?\"",
            d.port
        ),
        30,
    );
    assert!(
        !r.stdout.contains("curl=0"),
        "curl reached the daemon's API from inside:\n{}",
        show(&r)
    );
    for l in &listeners {
        assert_eq!(
            l.hits.load(Ordering::SeqCst),
            0,
            "the host listener on {} accepted a connection from the sandbox",
            l.addr
        );
    }
    assert_host_healthy(d);
}
