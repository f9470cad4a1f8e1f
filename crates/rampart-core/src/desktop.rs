//! What an exec does on a sandbox's desktop, read from its command line: `xdotool` (clicks,
//! pointer moves, keys, typed text) and `scrot` (screenshots), run directly or in a shell
//! script (`bash -l -c "xdotool click 1"`, as the e2b-desktop SDK sends them).
//!
//! The record gets a `desktop` event per action right after the exec's `exec`; text typed
//! is kept as its length and digest only, and the exec's recorded command has it replaced
//! (it may be a password). A screenshot's file is read from the sandbox's disk when the
//! command exits 0, before its `exit` is recorded (so before the caller can read or remove
//! it), and kept whole as a blob of the record.
//!
//! This reads what callers ask to run; it is not containment. A desktop action hidden from
//! it (a script file, `eval`, another tool) still runs and still has its `exec` and `exit`.

use crate::CoreError;
use futures::StreamExt as _;
use rampart_audit::content_digest;
use rampart_types::approval::script_commands;
use rampart_types::audit::{ContentRecord, Desktop, TypedText};
use rampart_types::desktop::{BrowserInfo, DesktopAction, ScrollDirection};
use rampart_types::{ExecEvent, ExecRequest};
use rustix::fs::OFlags;
use std::io::Read as _;
use std::os::fd::{AsFd as _, BorrowedFd};
use std::time::Duration;

/// The largest screenshot kept in the record (bytes); a larger file is recorded as missing.
pub(crate) const MAX_SCREENSHOT: u64 = 32 << 20;

/// What the record keeps of a command that acts on the desktop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Reading {
    /// The command as recorded: typed text replaced by its length and digest.
    pub(crate) argv: Vec<String>,
    /// The actions but screenshots, in order (`exec_id` empty: filled in when recorded).
    pub(crate) actions: Vec<Desktop>,
    /// The files screenshots are written to, absolute (`Err`: why none can be read).
    pub(crate) screenshots: Vec<Result<String, String>>,
}

impl Reading {
    fn is_empty(&self) -> bool {
        self.actions.is_empty() && self.screenshots.is_empty()
    }
}

/// An action with nothing but its kind.
pub(crate) fn action(kind: &str) -> Desktop {
    Desktop {
        exec_id: String::new(),
        action: kind.to_owned(),
        x: None,
        y: None,
        button: None,
        repeat: None,
        keys: None,
        text: None,
        image: None,
        width: None,
        height: None,
        missing: None,
    }
}

/// The shells whose `-c SCRIPT` is read.
fn is_shell(prog: &str) -> bool {
    matches!(base(prog), "sh" | "bash" | "dash" | "zsh" | "ksh")
}

fn base(prog: &str) -> &str {
    prog.rsplit('/').next().unwrap_or(prog)
}

/// Reads `argv` (run in `cwd`); `None` when it does nothing on a desktop.
pub(crate) fn read(argv: &[String], cwd: Option<&str>) -> Option<Reading> {
    // Every exec passes here: most name neither tool, and are not parsed at all.
    if !argv
        .iter()
        .any(|a| a.contains("xdotool") || a.contains("scrot"))
    {
        return None;
    }
    let prog = argv.first()?;
    let mut out = Reading {
        argv: argv.to_vec(),
        ..Reading::default()
    };
    if is_shell(prog) {
        let at = argv.iter().position(|a| {
            a.starts_with('-') && !a.starts_with("--") && a.contains('c') && a.len() > 1
        })?;
        let script = argv.get(at + 1)?;
        let (recorded, n) = read_script(script, cwd, &mut out);
        if n == 0 {
            return None;
        }
        out.argv[at + 1] = recorded;
    } else {
        let words = argv.to_vec();
        if let Some(hidden) = read_command(&words, cwd, &mut out) {
            out.argv = hidden;
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Reads each command of `script`; the script as recorded and how many commands acted.
fn read_script(script: &str, cwd: Option<&str>, out: &mut Reading) -> (String, usize) {
    let mut recorded = script.to_owned();
    let mut acted = 0;
    for cmd in script_commands(script) {
        let before = out.actions.len() + out.screenshots.len();
        match shlex::split(&cmd) {
            Some(words) => {
                let hidden = read_command(&words, cwd, out);
                if out.actions.len() + out.screenshots.len() > before {
                    acted += 1;
                }
                if let Some(h) = hidden {
                    let joined = shlex::try_join(h.iter().map(String::as_str))
                        .unwrap_or_else(|_| h.join(" "));
                    match recorded.find(cmd.as_str()) {
                        Some(i) => recorded.replace_range(i..i + cmd.len(), &joined),
                        // Not found verbatim: nothing of the script is kept.
                        None => return (hidden_script(script), acted.max(1)),
                    }
                }
            }
            // A command that names xdotool but cannot be read could type text: hide it all.
            None if cmd.contains("xdotool") => {
                out.actions.push(action("type"));
                return (hidden_script(script), acted + 1);
            }
            None => {}
        }
    }
    (recorded, acted)
}

/// What is recorded of a script that types text the reading could not separate.
fn hidden_script(script: &str) -> String {
    format!(
        "[script not kept: it may type text on the desktop; {} bytes, sha256:{}]",
        script.len(),
        content_digest(script.as_bytes()).to_hex()
    )
}

/// Reads one command (its words); the words as recorded when some were hidden.
fn read_command(words: &[String], cwd: Option<&str>, out: &mut Reading) -> Option<Vec<String>> {
    let prog = words.first()?;
    match base(prog) {
        "xdotool" => read_xdotool(words, out),
        "scrot" => {
            out.screenshots.push(scrot_file(&words[1..], cwd));
            None
        }
        _ => None,
    }
}

/// The button names of X's numbers.
fn button(n: &str) -> String {
    match n {
        "1" => "left",
        "2" => "middle",
        "3" => "right",
        "4" => "wheel_up",
        "5" => "wheel_down",
        "6" => "wheel_left",
        "7" => "wheel_right",
        other => other,
    }
    .to_owned()
}

/// Options of xdotool's commands that take a value.
fn takes_value(opt: &str) -> bool {
    matches!(
        opt,
        "--repeat"
            | "--delay"
            | "--window"
            | "--screen"
            | "--args"
            | "--terminator"
            | "--file"
            | "--desktop"
    )
}

/// A command's options, each with its value if it takes one.
type Opts<'a> = Vec<(&'a str, Option<&'a str>)>;

/// A command's options, the words after them, and how many words the options took.
fn split_opts(words: &[String]) -> (Opts<'_>, Vec<&str>, usize) {
    let mut opts = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        if w == "--" {
            i += 1;
            break;
        }
        if !w.starts_with("--") {
            break;
        }
        if takes_value(w) {
            opts.push((w, words.get(i + 1).map(String::as_str)));
            i += 2;
        } else {
            opts.push((w, None));
            i += 1;
        }
    }
    let rest: Vec<&str> = words[i.min(words.len())..]
        .iter()
        .map(String::as_str)
        .collect();
    (opts, rest, i)
}

/// xdotool's commands (chained in one invocation), the subset that acts: `click`,
/// `mousedown`, `mouseup`, `mousemove`, `mousemove_relative`, `key`, `keydown`, `keyup`,
/// `type` (which takes every word after it).
fn read_xdotool(words: &[String], out: &mut Reading) -> Option<Vec<String>> {
    let mut i = 1;
    while i < words.len() {
        let cmd = words[i].as_str();
        let (opts, rest, used) = split_opts(&words[i + 1..]);
        let opt = |name: &str| opts.iter().find(|(n, _)| *n == name).and_then(|(_, v)| *v);
        let next = |n: usize| i + 1 + used + n;
        match cmd {
            "click" | "mousedown" | "mouseup" => {
                let kind = match cmd {
                    "click" => "click",
                    "mousedown" => "mouse_down",
                    _ => "mouse_up",
                };
                let mut a = action(kind);
                a.button = Some(button(rest.first().copied().unwrap_or("1")));
                if cmd == "click" {
                    a.repeat = Some(opt("--repeat").and_then(|r| r.parse().ok()).unwrap_or(1));
                }
                out.actions.push(a);
                i = next(rest.len().min(1));
            }
            "mousemove" | "mousemove_relative" => {
                let mut a = action(if cmd == "mousemove" {
                    "move"
                } else {
                    "move_relative"
                });
                a.x = rest.first().and_then(|v| v.parse().ok());
                a.y = rest.get(1).and_then(|v| v.parse().ok());
                out.actions.push(a);
                i = next(rest.len().min(2));
            }
            "key" | "keydown" | "keyup" => {
                let kind = match cmd {
                    "key" => "key",
                    "keydown" => "key_down",
                    _ => "key_up",
                };
                let mut a = action(kind);
                a.keys = Some(rest.iter().map(|k| (*k).to_owned()).collect());
                out.actions.push(a);
                // Keys take the rest of the line.
                return None;
            }
            "type" => {
                let mut a = action("type");
                let mut hidden: Vec<String> = words[..=i].to_vec();
                if opt("--file").is_some() {
                    // Typed from a file: the record names no text, the command is kept.
                    out.actions.push(a);
                    return None;
                }
                let text: String = rest.concat();
                let typed = TypedText {
                    chars: text.chars().count() as u64,
                    digest: content_digest(text.as_bytes()),
                };
                for (n, v) in &opts {
                    hidden.push((*n).to_owned());
                    if let Some(v) = v {
                        hidden.push((*v).to_owned());
                    }
                }
                hidden.push("--".to_owned());
                hidden.push(format!(
                    "[typed text: {} chars, sha256:{}]",
                    typed.chars,
                    typed.digest.to_hex()
                ));
                a.text = Some(typed);
                out.actions.push(a);
                return Some(hidden);
            }
            _ => i += 1,
        }
    }
    None
}

/// Options of scrot that take a value (short and long).
fn scrot_takes_value(opt: &str) -> bool {
    matches!(
        opt,
        "-a" | "--autoselect"
            | "-C"
            | "--class"
            | "-d"
            | "--delay"
            | "-D"
            | "--display"
            | "-e"
            | "--exec"
            | "-F"
            | "--file"
            | "-k"
            | "-l"
            | "--line"
            | "-M"
            | "--monitor"
            | "-n"
            | "--note"
            | "-q"
            | "--quality"
            | "-S"
            | "--script"
            | "-t"
            | "--thumb"
            | "-w"
            | "--window"
    )
}

/// The file a `scrot` writes, absolute.
fn scrot_file(args: &[String], cwd: Option<&str>) -> Result<String, String> {
    let mut file = None;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if let Some(f) = a.strip_prefix("--file=") {
            file = Some(f.to_owned());
        } else if a == "-F" || a == "--file" {
            file = args.get(i + 1).cloned();
            i += 1;
        } else if a.starts_with('-') && a.len() > 1 {
            if scrot_takes_value(a) {
                i += 1;
            }
        } else {
            file = Some(a.to_owned());
        }
        i += 1;
    }
    let Some(f) = file else {
        return Err("scrot named no file".into());
    };
    if f.starts_with('/') {
        return Ok(f);
    }
    match cwd {
        Some(c) if c.starts_with('/') => Ok(format!("{}/{f}", c.trim_end_matches('/'))),
        _ => Err(format!(
            "scrot wrote {f:?}, relative to a working directory the record does not know"
        )),
    }
}

/// The size of a PNG from its header.
fn png_size(b: &[u8]) -> Option<(u32, u32)> {
    if b.len() < 24 || &b[..8] != b"\x89PNG\r\n\x1a\n" || &b[12..16] != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(b[16..20].try_into().ok()?);
    let h = u32::from_be_bytes(b[20..24].try_into().ok()?);
    Some((w, h))
}

/// Reads the screenshot at `path` (absolute, inside the sandbox) from its disk root (holding
/// `upper/`, maybe `usr-upper/`), beneath it and through no symlink or mount: what the
/// sandbox wrote there, never a file of the host. Fills in `a` (image, size) or why not;
/// returns the bytes to keep as a blob.
pub(crate) fn capture(root: BorrowedFd<'_>, path: &str, a: &mut Desktop) -> Option<Vec<u8>> {
    match read_beneath(root, path) {
        Ok(bytes) => {
            let digest = content_digest(&bytes);
            if let Some((w, h)) = png_size(&bytes) {
                a.width = Some(w);
                a.height = Some(h);
            }
            a.image = Some(ContentRecord {
                size: bytes.len() as u64,
                digest,
                blob: Some(digest),
                truncated: false,
            });
            Some(bytes)
        }
        Err(why) => {
            a.missing = Some(why);
            None
        }
    }
}

fn read_beneath(root: BorrowedFd<'_>, path: &str) -> Result<Vec<u8>, String> {
    let open = crate::artifacts::open_beneath;
    let (layer, rel) = match path.strip_prefix("/usr/") {
        Some(rel) if open(root, "usr-upper", OFlags::PATH | OFlags::DIRECTORY).is_ok() => {
            ("usr-upper", rel)
        }
        _ => ("upper", path.trim_start_matches('/')),
    };
    let dir = open(root, layer, OFlags::PATH | OFlags::DIRECTORY)
        .map_err(|e| format!("the sandbox's disk: {e}"))?;
    let f = open(dir.as_fd(), rel, OFlags::RDONLY | OFlags::NONBLOCK).map_err(|e| {
        format!("{path} is not a file the sandbox wrote on its disk (through no symlink): {e}")
    })?;
    let st = rustix::fs::fstat(&f).map_err(|e| format!("{path}: {e}"))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(format!("{path} is not a regular file"));
    }
    if st.st_size as u64 > MAX_SCREENSHOT {
        return Err(format!(
            "{path} has {} bytes, above the {MAX_SCREENSHOT} kept",
            st.st_size
        ));
    }
    let mut bytes = Vec::with_capacity(st.st_size as usize);
    std::fs::File::from(f)
        .take(MAX_SCREENSHOT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{path}: {e}"))?;
    if bytes.len() as u64 > MAX_SCREENSHOT {
        return Err(format!("{path} grew above the {MAX_SCREENSHOT} bytes kept"));
    }
    Ok(bytes)
}

/// The display of the desktop template (the e2b-desktop SDK's default).
pub const DEFAULT_DISPLAY: &str = ":0";
/// The port of the browser's DevTools protocol inside the sandbox (127.0.0.1).
pub const BROWSER_PORT: u16 = 9222;
/// How long a browser may take to answer on its DevTools port.
const BROWSER_START: Duration = Duration::from_secs(30);
/// How long one desktop command may take.
const ACTION_TIMEOUT_SECS: u64 = 60;

/// What a finished desktop command gave.
struct Ran {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Ran {
    fn check(self, what: &str, display: &str) -> Result<Ran, CoreError> {
        if self.code == Some(0) {
            return Ok(self);
        }
        let err = String::from_utf8_lossy(&self.stderr).trim().to_owned();
        let hint = if err.contains("open display") || err.contains("open X display") {
            format!(
                "; no X server answers on {display} (start the desktop: the e2b-desktop SDK's \
                 Sandbox.create(), or `rampart-desktop` in a sandbox of the desktop template)"
            )
        } else {
            String::new()
        };
        Err(CoreError::Desktop(format!(
            "{what} failed ({}){}{hint}",
            match self.code {
                Some(c) => format!("exit {c}"),
                None => "killed".to_owned(),
            },
            if err.is_empty() {
                String::new()
            } else {
                format!(": {err}")
            }
        )))
    }
}

fn check_display(display: &str) -> Result<(), CoreError> {
    let ok = display
        .strip_prefix(':')
        .is_some_and(|n| !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit()));
    if ok {
        Ok(())
    } else {
        Err(CoreError::BadRequest {
            field: "display".into(),
            message: format!("{display:?} is not a local display (expected :N)"),
        })
    }
}

impl crate::Sandbox<'_> {
    /// Runs `cmd` on `display` of the sandbox (recorded like any exec) and waits for it.
    async fn on_desktop(&self, cmd: Vec<String>, display: &str) -> Result<Ran, CoreError> {
        let req = ExecRequest {
            cmd,
            env: [("DISPLAY".to_owned(), display.to_owned())].into(),
            cwd: None,
            user: None,
            stdin: None,
            stdin_base64: None,
            tty: None,
            timeout_secs: Some(ACTION_TIMEOUT_SECS),
            stream: false,
            max_output_bytes: None,
        };
        let mut exec = self.exec(req, false).await?;
        let mut ran = Ran {
            code: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        while let Some(ev) = exec.events.next().await {
            match ev {
                ExecEvent::Stdout { data } => ran.stdout.extend_from_slice(&data.0),
                ExecEvent::Stderr { data } => ran.stderr.extend_from_slice(&data.0),
                ExecEvent::Exit { exit_code, .. } => {
                    ran.code = exit_code;
                    break;
                }
                ExecEvent::Error { message } => return Err(CoreError::Desktop(message)),
                _ => {}
            }
        }
        Ok(ran)
    }

    /// Takes a screenshot of `display` (default `:0`) of the sandbox with `scrot`, the
    /// pointer drawn in: the PNG. Recorded as every screenshot is (a `desktop` event with the
    /// image as a blob).
    pub async fn screenshot(&self, display: Option<&str>) -> Result<Vec<u8>, CoreError> {
        let display = display.unwrap_or(DEFAULT_DISPLAY);
        check_display(display)?;
        let path = format!(
            "/tmp/.rampart-screenshot-{}.png",
            &rampart_store::access::new_token()[..16]
        );
        self.on_desktop(
            ["scrot", "--overwrite", "--pointer", &path]
                .map(String::from)
                .to_vec(),
            display,
        )
        .await?
        .check("scrot", display)?;
        let root = self.upper_root().await?;
        let p = path.clone();
        let read = tokio::task::spawn_blocking(move || {
            let mut a = action("screenshot");
            capture(root.as_fd(), &p, &mut a).ok_or_else(|| a.missing.unwrap_or_default())
        })
        .await
        .map_err(CoreError::failed("reading a screenshot"))?;
        let _ = self.remove_file(&path, None).await;
        read.map_err(CoreError::Desktop)
    }

    /// Does `action` on `display` (default `:0`) of the sandbox with `xdotool`.
    pub async fn desktop_action(
        &self,
        action: &DesktopAction,
        display: Option<&str>,
    ) -> Result<(), CoreError> {
        let display = display.unwrap_or(DEFAULT_DISPLAY);
        check_display(display)?;
        for cmd in xdotool_argv(action)? {
            self.on_desktop(cmd, display)
                .await?
                .check("xdotool", display)?;
        }
        Ok(())
    }

    /// Starts the sandbox's browser (Chromium, through the template's `rampart-browser`)
    /// with its DevTools protocol on 127.0.0.1:9222, on `display` when an X server answers
    /// there, headless otherwise; or finds it running. Returns once the protocol answers.
    pub async fn start_browser(&self, display: Option<&str>) -> Result<BrowserInfo, CoreError> {
        let display = display.unwrap_or(DEFAULT_DISPLAY);
        check_display(display)?;
        if let Some(info) = self.browser_version().await? {
            return Ok(info);
        }
        let req = ExecRequest {
            cmd: vec!["rampart-browser".into(), BROWSER_PORT.to_string()],
            env: [("DISPLAY".to_owned(), display.to_owned())].into(),
            cwd: None,
            user: None,
            stdin: None,
            stdin_base64: None,
            tty: None,
            timeout_secs: None,
            stream: false,
            max_output_bytes: None,
        };
        let p = self.spawn_process(req).await?;
        let proc = self.process(p.pid)?;
        let deadline = tokio::time::Instant::now() + BROWSER_START;
        let mut delay = Duration::from_millis(20);
        loop {
            if let Some(mut info) = self.browser_version().await? {
                info.pid = Some(p.pid);
                return Ok(info);
            }
            if proc.ended() {
                let st = proc.status();
                return Err(CoreError::Desktop(format!(
                    "the browser ended ({}) before its DevTools protocol answered",
                    match (st.exit_code, st.signal, st.error) {
                        (_, _, Some(e)) => e,
                        (Some(c), _, _) => format!("exit {c}"),
                        (_, Some(s), _) => format!("signal {s}"),
                        _ => "lost".to_owned(),
                    }
                )));
            }
            if tokio::time::Instant::now() > deadline {
                let _ = proc.control().signal(true).await;
                return Err(CoreError::Desktop(format!(
                    "the browser did not answer on port {BROWSER_PORT} in {} s",
                    BROWSER_START.as_secs()
                )));
            }
            // The port has no event of its own: ask again, less often as time goes.
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(250));
        }
    }

    /// The running browser's DevTools version answer, if one answers on its port.
    async fn browser_version(&self) -> Result<Option<BrowserInfo>, CoreError> {
        let Ok(up) = self.tunnel(BROWSER_PORT).await else {
            return Ok(None);
        };
        let Ok(v) = devtools_version(up).await else {
            return Ok(None);
        };
        let headed = !v.user_agent.contains("Headless");
        // `ws://localhost:9222/devtools/browser/<id>`: its path.
        let ws_path = v
            .ws_url
            .split_once("://")
            .and_then(|(_, rest)| rest.find('/').map(|i| rest[i..].to_owned()))
            .unwrap_or_default();
        Ok(Some(BrowserInfo {
            port: BROWSER_PORT,
            headed,
            pid: None,
            version: v.browser,
            ws_path,
            cdp_url: String::new(),
            ws_url: String::new(),
        }))
    }
}

/// What `/json/version` of a DevTools protocol says.
#[derive(serde::Deserialize)]
struct DevtoolsVersion {
    #[serde(rename = "Browser")]
    browser: String,
    #[serde(rename = "User-Agent", default)]
    user_agent: String,
    #[serde(rename = "webSocketDebuggerUrl")]
    ws_url: String,
}

/// Asks `/json/version` over a tunnel to the DevTools port.
async fn devtools_version(up: crate::Tunnel) -> Result<DevtoolsVersion, String> {
    use http_body_util::BodyExt as _;
    let (mut send, conn) = hyper::client::conn::http1::handshake(up)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = hyper::Request::get("/json/version")
        .header("host", format!("localhost:{BROWSER_PORT}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(5), send.send_request(req))
        .await
        .map_err(|_| "no answer".to_owned())?
        .map_err(|e| e.to_string())?;
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

/// The xdotool commands of an action (argv, no shell).
fn xdotool_argv(a: &DesktopAction) -> Result<Vec<Vec<String>>, CoreError> {
    let x = |args: &[String]| {
        let mut v = vec!["xdotool".to_owned()];
        v.extend_from_slice(args);
        v
    };
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let bad = |field: &str, message: String| CoreError::BadRequest {
        field: field.into(),
        message,
    };
    Ok(match a {
        DesktopAction::Click {
            x: px,
            y: py,
            button,
            count,
        } => {
            let n = count.unwrap_or(1);
            if !(1..=10).contains(&n) {
                return Err(bad("count", format!("{n}: use 1 to 10")));
            }
            let mut out = Vec::new();
            match (px, py) {
                (Some(px), Some(py)) => out.push(x(&s(&[
                    "mousemove",
                    "--sync",
                    &px.to_string(),
                    &py.to_string(),
                ]))),
                (None, None) => {}
                _ => return Err(bad("x", "x and y go together".into())),
            }
            out.push(x(&s(&[
                "click",
                "--repeat",
                &n.to_string(),
                &button.number().to_string(),
            ])));
            out
        }
        DesktopAction::Move { x: px, y: py } => vec![x(&s(&[
            "mousemove",
            "--sync",
            &px.to_string(),
            &py.to_string(),
        ]))],
        DesktopAction::MouseDown { button } => {
            vec![x(&s(&["mousedown", &button.number().to_string()]))]
        }
        DesktopAction::MouseUp { button } => {
            vec![x(&s(&["mouseup", &button.number().to_string()]))]
        }
        DesktopAction::Drag { from, to } => vec![
            x(&s(&[
                "mousemove",
                "--sync",
                &from[0].to_string(),
                &from[1].to_string(),
            ])),
            x(&s(&["mousedown", "1"])),
            x(&s(&[
                "mousemove",
                "--sync",
                &to[0].to_string(),
                &to[1].to_string(),
            ])),
            x(&s(&["mouseup", "1"])),
        ],
        DesktopAction::Scroll { direction, amount } => {
            let n = amount.unwrap_or(1);
            if !(1..=100).contains(&n) {
                return Err(bad("amount", format!("{n}: use 1 to 100")));
            }
            let b = match direction {
                ScrollDirection::Up => "4",
                ScrollDirection::Down => "5",
            };
            vec![x(&s(&["click", "--repeat", &n.to_string(), b]))]
        }
        DesktopAction::Key { keys } => {
            if keys.is_empty() {
                return Err(bad("keys", "name at least one key".into()));
            }
            if let Some(k) = keys.iter().find(|k| {
                k.is_empty() || k.starts_with('-') || !k.bytes().all(|b| b.is_ascii_graphic())
            }) {
                return Err(bad("keys", format!("{k:?} is not a key name")));
            }
            let mut v = vec!["key".to_owned(), "--".to_owned()];
            v.extend(keys.iter().cloned());
            vec![x(&v)]
        }
        DesktopAction::Type { text } => {
            if text.is_empty() {
                return Ok(Vec::new());
            }
            vec![x(&[
                "type".into(),
                "--delay".into(),
                "12".into(),
                "--".into(),
                text.clone(),
            ])]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(script: &str) -> Vec<String> {
        vec!["/bin/bash".into(), "-l".into(), "-c".into(), script.into()]
    }

    #[test]
    fn the_sdks_commands_are_read() {
        let r = read(&argv("xdotool mousemove --sync 100 200"), None).unwrap();
        assert_eq!(r.actions[0].action, "move");
        assert_eq!((r.actions[0].x, r.actions[0].y), (Some(100), Some(200)));
        assert_eq!(r.argv, argv("xdotool mousemove --sync 100 200"));

        let r = read(&argv("xdotool click --repeat 2 1"), None).unwrap();
        assert_eq!(r.actions[0].action, "click");
        assert_eq!(r.actions[0].button.as_deref(), Some("left"));
        assert_eq!(r.actions[0].repeat, Some(2));

        let r = read(&argv("xdotool key Control_L+c"), None).unwrap();
        assert_eq!(r.actions[0].keys, Some(vec!["Control_L+c".to_owned()]));

        let r = read(&argv("xdotool mousedown 3 && xdotool mouseup 3"), None).unwrap();
        let kinds: Vec<_> = r.actions.iter().map(|a| a.action.as_str()).collect();
        assert_eq!(kinds, ["mouse_down", "mouse_up"]);

        let r = read(&argv("scrot --pointer /tmp/screenshot-1.png"), None).unwrap();
        assert!(r.actions.is_empty());
        assert_eq!(r.screenshots, vec![Ok("/tmp/screenshot-1.png".to_owned())]);

        // Reading the screen changes nothing: no event.
        assert!(read(&argv("xdotool getmouselocation"), None).is_none());
        assert!(read(&argv("echo hello"), None).is_none());
    }

    #[test]
    fn typed_text_is_never_kept() {
        let secret = "hunter2 is my password";
        let script = format!(
            "xdotool type --delay 75 -- {}",
            shlex::try_quote(secret).unwrap()
        );
        let r = read(&argv(&script), None).unwrap();
        let t = r.actions[0].text.as_ref().unwrap();
        assert_eq!(t.chars, secret.chars().count() as u64);
        assert_eq!(t.digest, content_digest(secret.as_bytes()));
        let kept = r.argv.join(" ");
        assert!(!kept.contains("hunter2"), "{kept}");
        assert!(kept.contains("--delay 75"), "{kept}");
        assert!(
            kept.contains(&content_digest(secret.as_bytes()).to_hex()),
            "{kept}"
        );

        // In a longer script, directly, and when the script cannot be split.
        let r = read(&argv("cd /tmp; xdotool type 'pass word'; echo done"), None).unwrap();
        assert!(!r.argv[3].contains("pass word"), "{}", r.argv[3]);
        assert!(r.argv[3].starts_with("cd /tmp; ") && r.argv[3].ends_with("; echo done"));
        let direct: Vec<String> = ["xdotool", "type", "s3cret!"].map(String::from).to_vec();
        let r = read(&direct, None).unwrap();
        assert!(!r.argv.concat().contains("s3cret"));
        let r = read(&argv("xdotool type \"unterminated s3cret"), None).unwrap();
        assert!(!r.argv[3].contains("s3cret"), "{}", r.argv[3]);
    }

    #[test]
    fn scrot_files_are_found() {
        let a = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            scrot_file(&a(&["-q", "80", "/tmp/x.png"]), None),
            Ok("/tmp/x.png".into())
        );
        assert_eq!(
            scrot_file(&a(&["x.png"]), Some("/home/user")),
            Ok("/home/user/x.png".into())
        );
        assert!(scrot_file(&a(&["x.png"]), None).is_err());
        assert!(scrot_file(&a(&["--pointer"]), None).is_err());
    }

    #[test]
    fn screenshots_are_read_beneath_the_disk_only() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("upper/tmp")).unwrap();
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&1024u32.to_be_bytes());
        png.extend_from_slice(&768u32.to_be_bytes());
        std::fs::write(t.path().join("upper/tmp/s.png"), &png).unwrap();
        std::fs::write(t.path().join("secret"), b"host file").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", t.path().join("upper/tmp/link.png")).unwrap();
        let root = std::fs::File::open(t.path()).unwrap();
        let mut a = action("screenshot");
        let kept = capture(root.as_fd(), "/tmp/s.png", &mut a).unwrap();
        assert_eq!(kept, png);
        assert_eq!((a.width, a.height), (Some(1024), Some(768)));
        assert_eq!(a.image.as_ref().unwrap().digest, content_digest(&png));
        for p in ["/tmp/link.png", "/../secret", "/tmp/none.png"] {
            let mut a = action("screenshot");
            assert!(capture(root.as_fd(), p, &mut a).is_none(), "{p}");
            assert!(a.missing.is_some() && a.image.is_none(), "{p}");
        }
    }
}
