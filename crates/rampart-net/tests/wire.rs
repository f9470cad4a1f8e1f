//! Wiring a real network namespace: wire, unwire, leftovers, failure cleanup, and the
//! firewall's redirect and drops. Needs root; skips (saying why) without it.

use rampart_net::{AddressPool, Net, NetConfig};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: needs root");
        return true;
    }
    false
}

/// A unique small tag for this test process and test.
fn tag(n: u32) -> u32 {
    (std::process::id().wrapping_mul(7) + n) % 200
}

fn net(n: u32, dns: u16, proxy: u16) -> Net {
    let t = tag(n);
    Net::new(NetConfig {
        pool: AddressPool::parse(&format!("10.250.{t}.0/24")).unwrap(),
        link_prefix: format!("rt{t}x"),
        table: format!("rampart_test_{}_{n}", std::process::id()),
        dns_port: dns,
        proxy_port: proxy,
    })
    .unwrap()
}

/// A process in a network namespace of its own (stands for a sandbox's PID 1).
struct NsProc(Child);

impl NsProc {
    fn start() -> NsProc {
        let child = Command::new("unshare")
            .args(["-n", "sleep", "600"])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare");
        let me = std::fs::read_link("/proc/self/ns/net").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let theirs = std::fs::read_link(format!("/proc/{}/ns/net", child.id()));
            if theirs.is_ok_and(|t| t != me)
                && std::fs::read_to_string(format!("/proc/{}/comm", child.id()))
                    .is_ok_and(|c| c.trim() == "sleep")
            {
                break;
            }
            assert!(Instant::now() < deadline, "unshare did not start");
            std::thread::sleep(Duration::from_millis(2));
        }
        NsProc(child)
    }
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
    /// Runs a command in its network namespace.
    fn run(&self, args: &[&str]) -> std::process::Output {
        let pid = self.pid().to_string();
        let mut a = vec!["-t", pid.as_str(), "-n", "--"];
        a.extend_from_slice(args);
        Command::new("nsenter").args(a).output().expect("nsenter")
    }
}

impl Drop for NsProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn link_exists(name: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(name).exists()
}

#[test]
fn wire_unwire_and_leftovers() {
    if skip() {
        return;
    }
    let net = net(1, 15053, 15001);
    let p = NsProc::start();
    let h = net.wire(p.pid(), 5).expect("wire");
    assert!(h.host_if.len() <= 15);
    assert!(link_exists(&h.host_if));
    let addr = String::from_utf8_lossy(&p.run(&["ip", "-4", "-o", "addr", "show", "eth0"]).stdout)
        .into_owned();
    assert!(
        addr.contains(&format!("{}/31", h.address)),
        "eth0 inside: {addr}"
    );
    let route = String::from_utf8_lossy(&p.run(&["ip", "-4", "route"]).stdout).into_owned();
    assert!(
        route.contains(&format!("default via {}", h.gateway)),
        "{route}"
    );
    let v6 =
        String::from_utf8_lossy(&p.run(&["ip", "-6", "addr", "show", "eth0"]).stdout).into_owned();
    assert!(!v6.contains("inet6"), "IPv6 inside: {v6}");
    let host = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["-o", "addr", "show", &h.host_if])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(host.contains(&format!("{}/31", h.gateway)), "{host}");
    assert!(!host.contains("inet6"), "{host}");
    // The host reaches the sandbox side over the link (no firewall loaded here).
    let ping = Command::new("ping")
        .args(["-c1", "-W2", &h.address.to_string()])
        .output();
    if let Ok(o) = ping {
        assert!(o.status.success(), "ping {}: {o:?}", h.address);
    }

    // Wiring the same slot again fails and leaves the first wiring alone.
    let p2 = NsProc::start();
    assert!(net.wire(p2.pid(), 5).is_err());
    assert!(link_exists(&h.host_if));
    assert!(!String::from_utf8_lossy(&p2.run(&["ip", "-o", "link"]).stdout).contains("eth0"));

    // Leftovers: slot 5 is a leftover unless alive.
    assert_eq!(net.leftovers(&[5]).unwrap(), Vec::<String>::new());
    assert_eq!(net.leftovers(&[]).unwrap(), vec![h.host_if.clone()]);

    net.unwire(5).expect("unwire");
    assert!(!link_exists(&h.host_if));
    net.unwire(5).expect("unwire is idempotent");
    assert!(!String::from_utf8_lossy(&p.run(&["ip", "-o", "link"]).stdout).contains("eth0"));
    assert!(net.leftovers(&[]).unwrap().is_empty());
}

#[test]
fn failed_wiring_leaves_nothing() {
    if skip() {
        return;
    }
    let net = net(2, 15053, 15001);
    // A pid that does not exist.
    assert!(net.wire(i32::MAX - 7, 1).is_err());
    assert!(!link_exists(&net.handle(1).unwrap().host_if));
    // A slot outside the pool.
    let p = NsProc::start();
    assert!(net.wire(p.pid(), 10_000).is_err());
    // The namespace already has an eth0: the peer cannot be created; nothing is left.
    let o = p.run(&[
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
    ]);
    assert!(o.status.success(), "{o:?}");
    assert!(net.wire(p.pid(), 2).is_err());
    assert!(!link_exists(&net.handle(2).unwrap().host_if));
    assert!(net.links().unwrap().is_empty());
}

#[test]
fn firewall_redirects_tcp_and_drops_the_rest() {
    if skip() {
        return;
    }
    if Command::new("nft").arg("--version").output().is_err() {
        eprintln!("SKIP: nft (Debian package nftables) is not installed");
        return;
    }
    // A proxy stand-in on the host.
    let proxy = TcpListener::bind("0.0.0.0:0").unwrap();
    let proxy_port = proxy.local_addr().unwrap().port();
    let net = net(3, 1, proxy_port);
    let fw = net.firewall();
    fw.install().expect("install firewall");
    struct Remove(rampart_net::FirewallSpec);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = self.0.remove();
        }
    }
    let _guard = Remove(fw.clone());
    let p = NsProc::start();
    let h = net.wire(p.pid(), 1).expect("wire");
    let _ = p.run(&["ip", "link", "set", "lo", "up"]);

    // Any TCP destination lands on the proxy, with the original destination readable.
    let accepted = std::thread::spawn(move || {
        let (mut s, peer) = proxy.accept().unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        s.write_all(b"pong\n").unwrap();
        (peer, original_dst(&s), b)
    });
    let o = p.run(&[
        "bash",
        "-c",
        "exec 3<>/dev/tcp/198.51.100.7/443; echo ping >&3; head -c5 <&3",
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "pong\n", "{o:?}");
    let (peer, orig, b) = accepted.join().unwrap();
    assert_eq!(&b, b"ping\n");
    assert_eq!(peer.ip(), std::net::IpAddr::V4(h.address));
    assert_eq!(
        orig,
        Some(SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 7), 443))
    );

    // The host's own addresses (other ports), loopback and metadata: nothing gets through.
    for dst in [
        format!("{}/22", h.gateway),
        "127.0.0.1/22".to_string(),
        "169.254.169.254/80".to_string(),
    ] {
        let o = p.run(&[
            "timeout",
            "3",
            "bash",
            "-c",
            &format!("exec 3<>/dev/tcp/{dst} && echo CONNECTED"),
        ]);
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("CONNECTED"),
            "{dst} reachable"
        );
    }
    // A spoofed source address goes nowhere: the proxy sees no second connection.
    let spoofed = net.handle(7).unwrap().address.to_string();
    let o = p.run(&["ip", "addr", "add", &format!("{spoofed}/32"), "dev", "eth0"]);
    assert!(o.status.success(), "{o:?}");
    let o = p.run(&[
        "timeout",
        "3",
        "curl",
        "-s",
        "--interface",
        &spoofed,
        "http://198.51.100.7/",
    ]);
    assert!(!o.status.success());

    net.unwire(1).unwrap();
}

/// `SO_ORIGINAL_DST` of an accepted, redirected connection.
fn original_dst(s: &std::net::TcpStream) -> Option<SocketAddrV4> {
    use std::os::fd::AsRawFd;
    // SAFETY: sockaddr_in is plain data; zeroed is a valid value.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `sa`, which is that large.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_IP,
            80, // SO_ORIGINAL_DST
            (&mut sa as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    (r == 0).then(|| {
        SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
            u16::from_be(sa.sin_port),
        )
    })
}
