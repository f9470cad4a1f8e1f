//! A stand-in for the agent used by the jail's tests: accepts on the inherited socket, reads
//! one line `<uid> <shell command>`, runs it with `/bin/sh -c` as that uid and answers with
//! its output followed by `\nEXIT <code>\n`.
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;

fn main() {
    let Some(fd) = std::env::var("RAMPART_AGENT_FD")
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        std::process::exit(2);
    };
    // SAFETY: the jailer hands us this listening socket.
    let l = unsafe { UnixListener::from_raw_fd(fd) };
    for conn in l.incoming() {
        let Ok(mut c) = conn else { continue };
        let mut line = String::new();
        if BufReader::new(&c).read_line(&mut line).is_err() {
            continue;
        }
        let (uid, cmd) = line.trim_end().split_once(' ').unwrap_or(("0", ""));
        let uid: u32 = uid.parse().unwrap_or(0);
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(cmd)
            .uid(uid)
            .gid(uid)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("HOME", if uid == 0 { "/root" } else { "/home/user" })
            .current_dir("/")
            .output();
        let reply = match out {
            Ok(o) => {
                let mut v = o.stdout;
                v.extend_from_slice(&o.stderr);
                v.extend_from_slice(
                    format!("\nEXIT {}\n", o.status.code().unwrap_or(-1)).as_bytes(),
                );
                v
            }
            Err(e) => format!("spawn: {e}\nEXIT 127\n").into_bytes(),
        };
        let _ = c.write_all(&reply);
        // Reap whatever has exited (we are PID 1).
        // SAFETY: plain waitpid.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
    }
}
