//! `rampart replay FILE`: runs a recorded session again and compares, step by step.

use super::audit::{fetch_key, trusted_key};
use crate::client::{Client, Lines};
use anyhow::{anyhow, bail, Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use clap::Args;
use rampart_audit::{verify_bundle, ContentHasher, ContentRecord, Event, EventBody, Hash};
use rampart_types::audit::{Exec, Exit};
use rampart_types::{CreateSandbox, ExecEvent, ExecRequest, LimitsRequest, SandboxInfo};
use reqwest::Method;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// `rampart replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The bundle to replay (verified first).
    file: PathBuf,
    /// The trusted node key for the verification (`ed25519:<hex>`).
    #[arg(long, value_name = "PUBKEY", conflicts_with = "key_file")]
    key: Option<String>,
    /// A file holding the trusted node key.
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// Keep the replay sandbox instead of destroying it at the end.
    #[arg(long)]
    keep: bool,
}

/// What one recorded exec gave, and what its replay gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Same exit and same output digests.
    Match,
    /// Something differs; says what.
    Divergent(String),
    /// The step could not be run again; says why.
    NotReplayable(String),
}

/// Compares a replayed run with the recorded exit.
pub fn compare(
    recorded: &Exit,
    exit_code: Option<i32>,
    signal: Option<i32>,
    stdout: &ContentRecord,
    stderr: &ContentRecord,
) -> Outcome {
    let mut diffs = Vec::new();
    if recorded.exit_code != exit_code || recorded.signal != signal {
        diffs.push(format!(
            "exit {} -> {}",
            status(recorded.exit_code, recorded.signal),
            status(exit_code, signal)
        ));
    }
    if recorded.stdout.digest != stdout.digest {
        diffs.push(format!(
            "stdout {} ({} B) -> {} ({} B)",
            recorded.stdout.digest.short(),
            recorded.stdout.size,
            stdout.digest.short(),
            stdout.size
        ));
    }
    if recorded.stderr.digest != stderr.digest {
        diffs.push(format!(
            "stderr {} ({} B) -> {} ({} B)",
            recorded.stderr.digest.short(),
            recorded.stderr.size,
            stderr.digest.short(),
            stderr.size
        ));
    }
    if diffs.is_empty() {
        Outcome::Match
    } else {
        Outcome::Divergent(diffs.join("; "))
    }
}

fn status(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(c), _) => c.to_string(),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "none".into(),
    }
}

/// A number recorded either as a JSON integer or (non-integers) as a decimal string.
fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// The creation request of the replay sandbox from the recorded spec.
pub fn create_request(template: &str, spec: &Value) -> CreateSandbox {
    let l = &spec["limits"];
    let u = |k: &str| num(&l[k]).map(|f| f as u64);
    CreateSandbox {
        template: Some(template.to_owned()),
        limits: LimitsRequest {
            cpus: num(&l["cpus"]),
            memory_bytes: u("memory_bytes"),
            pids: u("pids"),
            disk_bytes: u("disk_bytes"),
            open_files: u("open_files"),
        },
        env: BTreeMap::new(),
        metadata: [("rampart.replay".to_string(), "1".to_string())].into(),
        timeout_secs: Some(3600),
        ..CreateSandbox::default()
    }
}

/// One replay step: a recorded exec and its exit.
struct Step {
    seq: u64,
    exec: Exec,
    exit: Option<Exit>,
}

/// `rampart replay FILE`.
pub async fn replay(host: &crate::client::Endpoint, a: ReplayArgs) -> Result<u8> {
    let key = trusted_key(a.key.as_deref(), a.key_file.as_deref())?;
    let bytes =
        std::fs::read(&a.file).with_context(|| format!("cannot read {}", a.file.display()))?;
    let report = verify_bundle(&bytes, key.as_ref()).map_err(|e| {
        let at = e
            .seq()
            .map(|s| format!(" (record seq {s})"))
            .unwrap_or_default();
        anyhow!("the bundle does not verify{at}: {e}; refusing to replay it")
    })?;
    eprintln!(
        "bundle verified: sandbox {}, {} events",
        report.sandbox, report.events
    );
    let doc: Value = serde_json::from_slice(&bytes).context("reading the bundle")?;
    let events: Vec<Event> =
        serde_json::from_value(doc["events"].clone()).context("reading the bundle's events")?;
    let mut blobs: HashMap<Hash, Vec<u8>> = HashMap::new();
    if let Some(m) = doc["blobs"].as_object() {
        for (k, v) in m {
            if let (Ok(h), Some(b)) = (Hash::parse(k), v.as_str()) {
                if let Ok(bytes) = B64.decode(b) {
                    blobs.insert(h, bytes);
                }
            }
        }
    }
    let created = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::Created(c) => Some(c.clone()),
            _ => None,
        })
        .ok_or_else(|| anyhow!("the bundle has no `created` record: nothing to replay from"))?;
    let mut steps: Vec<Step> = Vec::new();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    let mut file_ops = 0usize;
    for e in &events {
        match &e.body {
            EventBody::Exec(x) => {
                by_id.insert(x.exec_id.clone(), steps.len());
                steps.push(Step {
                    seq: e.seq,
                    exec: x.clone(),
                    exit: None,
                });
            }
            EventBody::Exit(x) => {
                if let Some(&i) = by_id.get(&x.exec_id) {
                    steps[i].exit = Some(x.clone());
                }
            }
            EventBody::File(_) => file_ops += 1,
            _ => {}
        }
    }
    let c = Client::new(host)?;
    let node = fetch_key(&c).await?;
    match node.templates.get(&created.template) {
        None => bail!(
            "cannot replay: template {:?} is not on this daemon (recorded digest {})",
            created.template,
            created.template_digest
        ),
        Some(d) if *d != created.template_digest => bail!(
            "cannot replay: template {:?} has changed: recorded digest {}, this daemon's {}",
            created.template,
            created.template_digest,
            d
        ),
        Some(_) => {}
    }
    if file_ops > 0 {
        eprintln!(
            "note: {file_ops} file operation(s) made through the API are recorded by digest \
             only and are not replayed; steps that depend on them may diverge"
        );
    }
    if let Some(names) = created.spec["env_names"]
        .as_array()
        .filter(|a| !a.is_empty())
    {
        eprintln!(
            "note: the sandbox had environment variables {names:?} whose values are not \
             recorded; the replay runs without them"
        );
    }
    let info: SandboxInfo = c
        .json(
            c.request(Method::POST, "/v1/sandboxes")
                .json(&create_request(&created.template, &created.spec)),
        )
        .await
        .context("creating the replay sandbox")?;
    eprintln!("replaying in sandbox {}", info.id);
    let mut results = Vec::new();
    let run = run_steps(&c, info.id.as_str(), &steps, &blobs, &mut results).await;
    if !a.keep {
        let _ = c
            .send(c.request(Method::DELETE, &format!("/v1/sandboxes/{}", info.id)))
            .await;
    }
    run?;
    println!("{:<6} {:<14} {:<40} DETAIL", "SEQ", "RESULT", "COMMAND");
    let mut all = true;
    for (step, outcome) in steps.iter().zip(&results) {
        let (word, detail) = match outcome {
            Outcome::Match => ("match", String::new()),
            Outcome::Divergent(d) => ("DIVERGENT", d.clone()),
            Outcome::NotReplayable(d) => ("NOT REPLAYED", d.clone()),
        };
        all &= *outcome == Outcome::Match;
        let mut cmd = rampart_audit::report::printable(&step.exec.argv.join(" "));
        if cmd.chars().count() > 40 {
            cmd = cmd.chars().take(37).collect::<String>() + "...";
        }
        println!("#{:<5} {:<14} {:<40} {}", step.seq, word, cmd, detail);
    }
    let matched = results.iter().filter(|o| **o == Outcome::Match).count();
    println!("{matched} of {} steps match", steps.len());
    Ok(if all { 0 } else { 1 })
}

async fn run_steps(
    c: &Client,
    id: &str,
    steps: &[Step],
    blobs: &HashMap<Hash, Vec<u8>>,
    results: &mut Vec<Outcome>,
) -> Result<()> {
    for step in steps {
        let x = &step.exec;
        let Some(exit) = &step.exit else {
            results.push(Outcome::NotReplayable(
                "the recorded exec has no exit".into(),
            ));
            continue;
        };
        if exit.streamed_input.is_some() {
            results.push(Outcome::NotReplayable(
                "it read input streamed interactively".into(),
            ));
            continue;
        }
        if x.pty {
            results.push(Outcome::NotReplayable("it ran under a terminal".into()));
            continue;
        }
        let stdin = match &x.input {
            None => None,
            Some(r) if r.size == 0 => Some(Vec::new()),
            Some(r) => match (r.truncated, r.blob.and_then(|b| blobs.get(&b))) {
                (false, Some(b)) => Some(b.clone()),
                (true, _) => {
                    results.push(Outcome::NotReplayable(format!(
                        "its input ({} B) was longer than the kept blob",
                        r.size
                    )));
                    continue;
                }
                (false, None) => {
                    results.push(Outcome::NotReplayable(format!(
                        "its input blob {} is not in the bundle",
                        r.digest.short()
                    )));
                    continue;
                }
            },
        };
        let req = ExecRequest {
            cmd: x.argv.clone(),
            env: BTreeMap::new(),
            cwd: x.cwd.clone(),
            user: Some(x.user.clone()),
            stdin: None,
            stdin_base64: stdin.map(|b| B64.encode(b)),
            tty: None,
            timeout_secs: None,
            stream: true,
            max_output_bytes: None,
        };
        let resp = c
            .send(
                c.request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                    .json(&req),
            )
            .await?;
        let mut out = ContentHasher::new(0);
        let mut err = ContentHasher::new(0);
        let mut end: Option<(Option<i32>, Option<i32>)> = None;
        let mut lines = Lines::new(resp.bytes_stream());
        while let Some(line) = lines.next().await {
            let line = line.context("reading the exec stream")?;
            match serde_json::from_slice::<ExecEvent>(&line)? {
                ExecEvent::Stdout { data } => out.update(data.as_bytes()),
                ExecEvent::Stderr { data } => err.update(data.as_bytes()),
                ExecEvent::Pty { data } => out.update(data.as_bytes()),
                ExecEvent::Exit {
                    exit_code, signal, ..
                } => end = Some((exit_code, signal)),
                ExecEvent::Error { message } => bail!("replaying step {}: {message}", step.seq),
                ExecEvent::Denied { reason, .. } => {
                    bail!("replaying step {}: denied: {reason}", step.seq)
                }
                ExecEvent::PendingApproval { approval_id, .. } => eprintln!(
                    "rampart: step {} waits for approval {approval_id} (rampart approve {approval_id})",
                    step.seq
                ),
                ExecEvent::Start { .. } => {}
            }
        }
        let Some((code, signal)) = end else {
            bail!(
                "replaying step {}: the exec stream ended without an exit",
                step.seq
            );
        };
        results.push(compare(
            exit,
            code,
            signal,
            &out.finish().0,
            &err.finish().0,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(b: &[u8]) -> ContentRecord {
        ContentHasher::record(b, 0).0
    }

    fn exit(code: i32, out: &[u8]) -> Exit {
        Exit {
            exec_id: "x1".into(),
            exit_code: Some(code),
            signal: None,
            timed_out: false,
            wall_ms: 1,
            cpu_ms: None,
            peak_memory_bytes: None,
            stdout: rec(out),
            stderr: rec(b""),
            streamed_input: None,
        }
    }

    #[test]
    fn compare_names_what_differs() {
        let e = exit(0, b"hi\n");
        assert_eq!(
            compare(&e, Some(0), None, &rec(b"hi\n"), &rec(b"")),
            Outcome::Match
        );
        let Outcome::Divergent(d) = compare(&e, Some(1), None, &rec(b"ho\n"), &rec(b"")) else {
            panic!("expected divergence");
        };
        assert!(d.contains("exit 0 -> 1") && d.contains("stdout"), "{d}");
    }

    #[test]
    fn recorded_limits_come_back() {
        let spec = serde_json::json!({"limits": {"cpus": "0.5", "memory_bytes": 536870912,
            "pids": 100, "disk_bytes": 1073741824, "open_files": 64}});
        let r = create_request("base", &spec);
        assert_eq!(r.limits.cpus, Some(0.5));
        assert_eq!(r.limits.memory_bytes, Some(536870912));
        assert_eq!(r.template.as_deref(), Some("base"));
    }
}
