//! Pure checks of requests, and pure mappings of agent answers.

use crate::CoreError;
use base64::Engine;
use rampart_agent::client::StartOptions;
use rampart_types::{CreateSandbox, ExecRequest, LimitError, Limits, VolumeMount};
use std::collections::BTreeMap;
use std::time::Duration;

/// Templates this daemon serves.
pub const TEMPLATES: &[&str] = &["base", crate::interpreter::TEMPLATE];
/// Most environment variables per sandbox or exec.
pub const MAX_ENV_VARS: usize = 1024;
/// Most bytes of environment (names and values) per sandbox or exec.
pub const MAX_ENV_BYTES: usize = 128 * 1024;
/// Most metadata pairs.
pub const MAX_METADATA_PAIRS: usize = 64;
/// Longest metadata key, bytes.
pub const MAX_METADATA_KEY: usize = 128;
/// Longest metadata value, bytes.
pub const MAX_METADATA_VALUE: usize = 1024;
/// Most bytes of stdin given inline in an exec request.
pub const MAX_INLINE_STDIN: usize = 16 * 1024 * 1024;

fn bad(field: &str, message: impl Into<String>) -> CoreError {
    CoreError::BadRequest {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// `secret_env` names entries of `env` whose values are long enough to redact.
pub fn check_secret_env(req: &CreateSandbox) -> Result<(), CoreError> {
    for (i, name) in req.secret_env.iter().enumerate() {
        let Some(v) = req.env.get(name) else {
            return Err(bad(
                "secret_env",
                format!("secret_env[{i}]: {name:?} is not a variable of env"),
            ));
        };
        if v.len() < rampart_audit::redact::MIN_SECRET_LEN {
            return Err(bad(
                "secret_env",
                format!(
                    "secret_env[{i}]: the value of {name} is shorter than {} bytes: too short \
                     to redact without editing ordinary output",
                    rampart_audit::redact::MIN_SECRET_LEN
                ),
            ));
        }
    }
    Ok(())
}

/// Checks environment variables: names non-empty without `=` or NUL, values without NUL.
pub fn check_env(field: &str, env: &BTreeMap<String, String>) -> Result<(), CoreError> {
    if env.len() > MAX_ENV_VARS {
        return Err(bad(field, format!("at most {MAX_ENV_VARS} variables")));
    }
    let mut total = 0usize;
    for (k, v) in env {
        if k.is_empty() {
            return Err(bad(field, "a variable name is empty"));
        }
        if k.contains('=') || k.contains('\0') {
            return Err(bad(
                field,
                format!("variable name {k:?} contains '=' or NUL"),
            ));
        }
        if v.contains('\0') {
            return Err(bad(field, format!("value of {k} contains NUL")));
        }
        total += k.len() + v.len() + 2;
    }
    if total > MAX_ENV_BYTES {
        return Err(bad(
            field,
            format!("more than {MAX_ENV_BYTES} bytes in all"),
        ));
    }
    Ok(())
}

/// Checks metadata sizes.
pub fn check_metadata(md: &BTreeMap<String, String>) -> Result<(), CoreError> {
    if md.len() > MAX_METADATA_PAIRS {
        return Err(bad(
            "metadata",
            format!("at most {MAX_METADATA_PAIRS} pairs"),
        ));
    }
    for (k, v) in md {
        if k.is_empty() || k.len() > MAX_METADATA_KEY {
            return Err(bad(
                "metadata",
                format!("keys must be 1 to {MAX_METADATA_KEY} bytes"),
            ));
        }
        if v.len() > MAX_METADATA_VALUE {
            return Err(bad(
                "metadata",
                format!("value of {k:?} is longer than {MAX_METADATA_VALUE} bytes"),
            ));
        }
    }
    Ok(())
}

/// Checks a timeout in seconds against the daemon's maximum.
pub fn check_timeout(field: &'static str, secs: u64, max: u64) -> Result<(), CoreError> {
    if secs == 0 {
        return Err(bad(field, "must be at least 1 second"));
    }
    if secs > max {
        return Err(CoreError::Limit(LimitError::AboveMaximum {
            field,
            value: secs.to_string(),
            max: max.to_string(),
        }));
    }
    Ok(())
}

/// A create request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidCreate {
    /// Template name.
    pub template: String,
    /// Resolved limits.
    pub limits: Limits,
    /// Lifetime.
    pub timeout_secs: u64,
}

/// Checks a create request against the daemon's limits.
pub fn check_create(
    req: &CreateSandbox,
    defaults: &Limits,
    max: &Limits,
    default_timeout: u64,
    max_timeout: u64,
) -> Result<ValidCreate, CoreError> {
    check_create_with(req, defaults, max, default_timeout, max_timeout, &|_| false)
}

/// Most ports a sandbox may make public.
pub const MAX_PUBLIC_PORTS: usize = 100;

/// Checks the ports a create asks to make public (1-65535, at most [`MAX_PUBLIC_PORTS`]);
/// returns them sorted, each once.
pub fn check_public_ports(ports: &[u16]) -> Result<Vec<u16>, CoreError> {
    if ports.contains(&0) {
        return Err(CoreError::BadRequest {
            field: "public_ports".into(),
            message: "port 0 is not a port; use 1-65535".into(),
        });
    }
    if ports.len() > MAX_PUBLIC_PORTS {
        return Err(CoreError::BadRequest {
            field: "public_ports".into(),
            message: format!("at most {MAX_PUBLIC_PORTS} ports"),
        });
    }
    let mut v = ports.to_vec();
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// [`check_create`] that also accepts the template names `built` knows (templates built
/// into the image store, see `rampart-image`).
pub fn check_create_with(
    req: &CreateSandbox,
    defaults: &Limits,
    max: &Limits,
    default_timeout: u64,
    max_timeout: u64,
    built: &dyn Fn(&str) -> bool,
) -> Result<ValidCreate, CoreError> {
    let template = req.template.clone().unwrap_or_else(|| "base".to_owned());
    if !TEMPLATES.contains(&template.as_str()) && !built(&template) {
        return Err(bad(
            "template",
            format!(
                "unknown template {template:?}; available: {}",
                TEMPLATES.join(", ")
            ),
        ));
    }
    check_env("env", &req.env)?;
    check_secret_env(req)?;
    check_metadata(&req.metadata)?;
    check_not_yet(req)?;
    check_artifacts(&req.artifacts, &req.volumes)?;
    let timeout_secs = req.timeout_secs.unwrap_or(default_timeout);
    check_timeout("timeout_secs", timeout_secs, max_timeout)?;
    let limits = req.limits.resolve(defaults, max)?;
    Ok(ValidCreate {
        template,
        limits,
        timeout_secs,
    })
}

/// Most `artifacts` paths a create may name.
pub const MAX_ARTIFACT_PATHS: usize = 32;

/// Trees of the sandbox that are not on its disk (kernel file systems the tier mounts), so
/// nothing of them could be kept.
const NOT_ON_DISK: [&str; 3] = ["/proc", "/sys", "/dev"];

/// Whether `p` is `dir` or below it (both normal absolute paths).
fn is_under(p: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    p == dir || (p.starts_with(dir) && p.as_bytes().get(dir.len()) == Some(&b'/'))
}

/// Checks the `artifacts` of a create: each an absolute, normal path inside the sandbox (no
/// `.`, `..` or empty component, no trailing `/`, no NUL or control character, not `/`
/// itself), on the sandbox's disk (not under `/proc`, `/sys`, `/dev`, nor on one of its
/// `volumes`, which outlive it anyway), given once, at most [`MAX_ARTIFACT_PATHS`].
pub fn check_artifacts(paths: &[String], volumes: &[VolumeMount]) -> Result<(), CoreError> {
    if paths.len() > MAX_ARTIFACT_PATHS {
        return Err(bad(
            "artifacts",
            format!("at most {MAX_ARTIFACT_PATHS} paths, got {}", paths.len()),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for p in paths {
        let why = |m: &str| bad("artifacts", format!("{p:?}: {m}"));
        if !p.starts_with('/') {
            return Err(why(
                "must be an absolute path inside the sandbox (start with /)",
            ));
        }
        if p.len() > 4096 {
            return Err(why("longer than 4096 bytes"));
        }
        if p.chars().any(char::is_control) {
            return Err(why("contains a NUL or control character"));
        }
        if p == "/" {
            return Err(why(
                "must name a file or directory below /, not the whole root",
            ));
        }
        if p.ends_with('/') {
            return Err(why("ends with /: name the directory without it"));
        }
        for c in p[1..].split('/') {
            match c {
                "" => return Err(why("has an empty component (//)")),
                "." | ".." => {
                    return Err(why("has a . or .. component: the path must stay inside the sandbox and be written one way"))
                }
                _ => {}
            }
        }
        if let Some(d) = NOT_ON_DISK.iter().find(|d| is_under(p, d)) {
            return Err(why(&format!("{d} is not on the sandbox's disk")));
        }
        if let Some(v) = volumes.iter().find(|v| is_under(p, &v.path)) {
            return Err(why(&format!(
                "is on volume {:?} (mounted at {}), which outlives the sandbox by itself",
                v.name, v.path
            )));
        }
        if !seen.insert(p.as_str()) {
            return Err(why("given twice"));
        }
    }
    Ok(())
}

/// Refuses (fail closed) the create fields whose implementation has not landed, so a policy
/// is never silently ignored. Each is removed from here when it is enforced.
fn check_not_yet(_req: &CreateSandbox) -> Result<(), CoreError> {
    Ok(())
}

/// An exec request, checked and turned into agent options.
#[derive(Debug, Clone)]
pub struct ValidExec {
    /// What to ask the agent.
    pub opts: StartOptions,
    /// Bytes to write to stdin after start.
    pub stdin: Option<Vec<u8>>,
    /// Whether the process has a PTY.
    pub pty: bool,
    /// The exec's timeout, enforced by core.
    pub timeout: Option<Duration>,
}

/// Extra time the agent's own timeout gets beyond core's, so core's kill comes first and the
/// agent's is only a backstop.
pub const AGENT_TIMEOUT_MARGIN: Duration = Duration::from_secs(2);

/// Checks an exec request.
pub fn check_exec(req: &ExecRequest, keep_stdin_open: bool) -> Result<ValidExec, CoreError> {
    let (cmd, args) = match req.cmd.split_first() {
        Some((c, a)) => (c, a),
        None => return Err(bad("cmd", "must name a program")),
    };
    if cmd.is_empty() {
        return Err(bad("cmd", "the program name is empty"));
    }
    if req.cmd.iter().any(|a| a.contains('\0')) {
        return Err(bad("cmd", "contains NUL"));
    }
    check_env("env", &req.env)?;
    if let Some(cwd) = &req.cwd {
        if cwd.is_empty() || cwd.contains('\0') {
            return Err(bad("cwd", "must be a non-empty path without NUL"));
        }
    }
    if let Some(user) = &req.user {
        if user.is_empty() || user.contains('\0') || user.contains('/') {
            return Err(bad("user", "must be a user name"));
        }
    }
    let stdin = match (&req.stdin, &req.stdin_base64) {
        (Some(_), Some(_)) => {
            return Err(bad("stdin", "give stdin or stdin_base64, not both"));
        }
        (Some(s), None) => Some(s.as_bytes().to_vec()),
        (None, Some(b)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b.as_bytes())
                .map_err(|e| bad("stdin_base64", format!("not valid base64: {e}")))?,
        ),
        (None, None) => None,
    };
    if stdin.as_ref().is_some_and(|s| s.len() > MAX_INLINE_STDIN) {
        return Err(CoreError::TooLarge(format!(
            "stdin: more than {MAX_INLINE_STDIN} bytes inline; stream it instead"
        )));
    }
    if let Some([cols, rows]) = req.tty {
        if cols == 0 || rows == 0 {
            return Err(bad("tty", "columns and rows must be at least 1"));
        }
    }
    let timeout = match req.timeout_secs {
        Some(0) => return Err(bad("timeout_secs", "must be at least 1 second")),
        Some(s) => Some(Duration::from_secs(s)),
        None => None,
    };
    let opts = StartOptions {
        cmd: cmd.clone(),
        args: args.to_vec(),
        envs: req.env.clone(),
        cwd: req.cwd.clone(),
        user: req.user.clone(),
        stdin: stdin.is_some() || keep_stdin_open,
        pty: req.tty.map(|[c, r]| (c, r)),
        tag: None,
        timeout: timeout.map(|t| t + AGENT_TIMEOUT_MARGIN),
    };
    Ok(ValidExec {
        opts,
        stdin,
        pty: req.tty.is_some(),
        timeout,
    })
}

/// Linux signal numbers by the names Go's `os.ProcessState.String()` (envd) prints, and the
/// usual short and `SIG` names.
const SIGNALS: &[(i32, &[&str])] = &[
    (1, &["hangup", "hup"]),
    (2, &["interrupt", "int"]),
    (3, &["quit"]),
    (4, &["illegal instruction", "ill"]),
    (5, &["trace/breakpoint trap", "trap"]),
    (6, &["aborted", "abort", "abrt", "iot"]),
    (7, &["bus error", "bus"]),
    (8, &["floating point exception", "fpe"]),
    (9, &["killed", "kill"]),
    (10, &["user defined signal 1", "usr1"]),
    (11, &["segmentation fault", "segv"]),
    (12, &["user defined signal 2", "usr2"]),
    (13, &["broken pipe", "pipe"]),
    (14, &["alarm clock", "alrm"]),
    (15, &["terminated", "term"]),
    (16, &["stack fault", "stkflt"]),
    (17, &["child exited", "chld"]),
    (18, &["continued", "cont"]),
    (19, &["stopped (signal)", "stop"]),
    (20, &["stopped", "tstp"]),
    (21, &["stopped (tty input)", "ttin"]),
    (22, &["stopped (tty output)", "ttou"]),
    (23, &["urgent i/o condition", "urg"]),
    (24, &["cpu time limit exceeded", "xcpu"]),
    (25, &["file size limit exceeded", "xfsz"]),
    (26, &["virtual timer expired", "vtalrm"]),
    (27, &["profiling timer expired", "prof"]),
    (28, &["window changed", "winch"]),
    (29, &["i/o possible", "io", "poll"]),
    (30, &["power failure", "pwr"]),
    (31, &["bad system call", "sys"]),
];

/// The signal number in an end status such as `signal: killed`, `signal: 9`,
/// `signal: SIGKILL` or `killed by signal 9`; None if the status names no signal.
pub fn parse_signal(status: &str) -> Option<i32> {
    let s = status.trim().to_ascii_lowercase();
    let rest = s
        .strip_prefix("signal:")
        .or_else(|| s.strip_prefix("killed by signal"))
        .or_else(|| s.strip_prefix("signal"))?;
    let rest = rest.trim();
    let rest = rest.strip_suffix("(core dumped)").unwrap_or(rest).trim();
    if let Ok(n) = rest.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let name = rest.strip_prefix("sig").unwrap_or(rest);
    SIGNALS
        .iter()
        .find(|(_, names)| names.contains(&rest) || names.contains(&name))
        .map(|(n, _)| *n)
}

/// The exit code in an end status such as `exit status 3`.
pub fn parse_exit_status(status: &str) -> Option<i32> {
    status
        .trim()
        .strip_prefix("exit status")?
        .trim()
        .parse()
        .ok()
}

/// `(exit_code, signal)` of an agent's end event: exactly one is set when known.
pub fn exit_of(exit_code: i32, exited: bool, status: &str) -> (Option<i32>, Option<i32>) {
    if exited {
        return (Some(exit_code), None);
    }
    if let Some(sig) = parse_signal(status) {
        return (None, Some(sig));
    }
    if let Some(code) = parse_exit_status(status) {
        return (Some(code), None);
    }
    // The agent said it did not exit normally but gave no readable status: a shell-style
    // code above 128 still names the signal.
    if exit_code > 128 && exit_code <= 128 + 64 {
        return (None, Some(exit_code - 128));
    }
    (Some(exit_code), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_types::LimitsRequest;

    #[test]
    fn artifact_paths_must_stay_inside_the_sandbox() {
        let ok =
            |p: &[&str]| check_artifacts(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &[]);
        assert!(ok(&[]).is_ok());
        assert!(ok(&["/home/user/out", "/tmp/report.txt", "/devices"]).is_ok());
        for (p, why) in [
            ("home/user/out", "absolute"),
            ("", "absolute"),
            ("./out", "absolute"),
            ("/home/../etc/shadow", ".."),
            ("/home/user/..", ".."),
            ("/home/./user", "."),
            ("/home//user", "empty component"),
            ("/home/user/", "ends with /"),
            ("/", "whole root"),
            ("/home/a\0b", "NUL"),
            ("/home/a\nb", "control"),
            ("/proc/1/root", "/proc is not on"),
            ("/sys", "/sys is not on"),
            ("/dev/shm/x", "/dev is not on"),
        ] {
            let e = ok(&[p]).expect_err(p).to_string();
            assert!(e.contains(why), "{p:?}: {e}");
            assert!(e.contains("artifacts"), "{p:?}: {e}");
        }
        let e = ok(&["/a", "/a"]).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
        let many: Vec<String> = (0..=MAX_ARTIFACT_PATHS).map(|i| format!("/o{i}")).collect();
        assert!(check_artifacts(&many, &[]).is_err());
        let vol = VolumeMount {
            name: "data".into(),
            path: "/data".into(),
            read_only: false,
        };
        let e = check_artifacts(&["/data/out".into()], std::slice::from_ref(&vol))
            .unwrap_err()
            .to_string();
        assert!(e.contains("volume"), "{e}");
        assert!(check_artifacts(&["/database".into()], &[vol]).is_ok());
    }

    fn max() -> Limits {
        Limits {
            cpus: 2.0,
            memory_bytes: 4 << 30,
            pids: 4096,
            disk_bytes: 10 << 30,
            open_files: 65536,
        }
    }

    fn create(req: CreateSandbox) -> Result<ValidCreate, CoreError> {
        check_create(&req, &Limits::default(), &max(), 300, 3600)
    }

    fn field_of(e: CoreError) -> String {
        match e {
            CoreError::BadRequest { field, .. } => field,
            CoreError::Limit(l) => format!("limit:{}", l.field()),
            CoreError::TooLarge(_) => "too_large".into(),
            other => format!("other:{other}"),
        }
    }

    #[test]
    fn create_defaults() {
        let v = create(CreateSandbox::default()).unwrap();
        assert_eq!(v.template, "base");
        assert_eq!(v.timeout_secs, 300);
        assert_eq!(v.limits, Limits::default());
    }

    #[test]
    fn create_refusals_name_the_field() {
        let e = create(CreateSandbox {
            template: Some("ubuntu".into()),
            ..Default::default()
        });
        assert_eq!(field_of(e.unwrap_err()), "template");
        for name in ["", "A=B", "A\0"] {
            let e = create(CreateSandbox {
                env: [(name.to_string(), "v".to_string())].into(),
                ..Default::default()
            });
            assert_eq!(field_of(e.unwrap_err()), "env", "{name:?}");
        }
        let e = create(CreateSandbox {
            metadata: [("k".to_string(), "v".repeat(5000))].into(),
            ..Default::default()
        });
        assert_eq!(field_of(e.unwrap_err()), "metadata");
        let e = create(CreateSandbox {
            timeout_secs: Some(0),
            ..Default::default()
        });
        assert_eq!(field_of(e.unwrap_err()), "timeout_secs");
        let e = create(CreateSandbox {
            timeout_secs: Some(3601),
            ..Default::default()
        });
        assert_eq!(field_of(e.unwrap_err()), "limit:timeout_secs");
        let e = create(CreateSandbox {
            limits: LimitsRequest {
                memory_bytes: Some(8 << 30),
                ..Default::default()
            },
            ..Default::default()
        });
        assert_eq!(field_of(e.unwrap_err()), "limit:memory_bytes");
    }

    fn exec(req: ExecRequest) -> Result<ValidExec, CoreError> {
        check_exec(&req, false)
    }

    #[test]
    fn exec_maps_to_start_options() {
        let v = check_exec(
            &ExecRequest {
                cmd: vec!["sh".into(), "-c".into(), "cat".into()],
                stdin_base64: Some("aGk=".into()),
                tty: Some([80, 24]),
                timeout_secs: Some(5),
                user: Some("root".into()),
                ..Default::default()
            },
            false,
        )
        .unwrap();
        assert_eq!(v.opts.cmd, "sh");
        assert_eq!(v.opts.args, vec!["-c", "cat"]);
        assert!(v.opts.stdin);
        assert_eq!(v.stdin.as_deref(), Some(&b"hi"[..]));
        assert_eq!(v.opts.pty, Some((80, 24)));
        assert!(v.pty);
        assert_eq!(v.timeout, Some(Duration::from_secs(5)));
        assert_eq!(
            v.opts.timeout,
            Some(Duration::from_secs(5) + AGENT_TIMEOUT_MARGIN)
        );
        assert_eq!(v.opts.user.as_deref(), Some("root"));

        let v = exec(ExecRequest {
            cmd: vec!["true".into()],
            ..Default::default()
        })
        .unwrap();
        assert!(!v.opts.stdin);
        assert!(v.stdin.is_none());
        let v = check_exec(
            &ExecRequest {
                cmd: vec!["cat".into()],
                ..Default::default()
            },
            true,
        )
        .unwrap();
        assert!(v.opts.stdin);
    }

    #[test]
    fn exec_refusals_name_the_field() {
        let e = exec(ExecRequest::default()).unwrap_err();
        assert_eq!(field_of(e), "cmd");
        let e = exec(ExecRequest {
            cmd: vec!["".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(field_of(e), "cmd");
        let e = exec(ExecRequest {
            cmd: vec!["cat".into()],
            stdin: Some("a".into()),
            stdin_base64: Some("YQ==".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(field_of(e), "stdin");
        let e = exec(ExecRequest {
            cmd: vec!["cat".into()],
            stdin_base64: Some("!!!".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(field_of(e), "stdin_base64");
        let e = exec(ExecRequest {
            cmd: vec!["cat".into()],
            tty: Some([0, 24]),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(field_of(e), "tty");
        let e = exec(ExecRequest {
            cmd: vec!["cat".into()],
            timeout_secs: Some(0),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(field_of(e), "timeout_secs");
        let e = exec(ExecRequest {
            cmd: vec!["cat".into()],
            env: [("X=Y".to_string(), String::new())].into(),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(field_of(e), "env");
    }

    #[test]
    fn public_ports_are_checked_sorted_and_deduplicated() {
        assert_eq!(
            check_public_ports(&[8080, 3000, 8080]).unwrap(),
            vec![3000, 8080]
        );
        assert!(check_public_ports(&[]).unwrap().is_empty());
        let zero = check_public_ports(&[80, 0]).unwrap_err().to_string();
        assert!(zero.starts_with("public_ports: port 0"), "{zero}");
        let many: Vec<u16> = (1..=MAX_PUBLIC_PORTS as u16 + 1).collect();
        let e = check_public_ports(&many).unwrap_err().to_string();
        assert!(e.contains("at most 100"), "{e}");
        assert!(check_public_ports(&many[..MAX_PUBLIC_PORTS]).is_ok());
    }

    #[test]
    fn signals_parse() {
        assert_eq!(parse_signal("signal: killed"), Some(9));
        assert_eq!(parse_signal("signal: terminated"), Some(15));
        assert_eq!(
            parse_signal("signal: segmentation fault (core dumped)"),
            Some(11)
        );
        assert_eq!(parse_signal("signal: interrupt"), Some(2));
        assert_eq!(parse_signal("signal: 9"), Some(9));
        assert_eq!(parse_signal("signal: SIGKILL"), Some(9));
        assert_eq!(parse_signal("killed by signal 15"), Some(15));
        assert_eq!(parse_signal("exit status 1"), None);
        assert_eq!(parse_signal("signal: nonsense"), None);
        assert_eq!(parse_signal("signal: 999"), None);
        assert_eq!(parse_signal(""), None);
    }

    #[test]
    fn exits_map() {
        assert_eq!(exit_of(3, true, "exit status 3"), (Some(3), None));
        assert_eq!(exit_of(0, false, "signal: killed"), (None, Some(9)));
        assert_eq!(exit_of(0, false, "exit status 2"), (Some(2), None));
        assert_eq!(exit_of(137, false, ""), (None, Some(9)));
        assert_eq!(exit_of(-1, false, ""), (Some(-1), None));
    }
}
