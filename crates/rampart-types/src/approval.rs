//! Approvals: commands a sandbox's policy holds until a person (a key with the `approve`
//! scope) decides.

use serde::{Deserialize, Serialize};

/// A sandbox's approval policy (`"approvals"` at create).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalPolicy {
    /// Regular expressions over a command line: an exec matching one is held until approved
    /// (the argv joined with shell quoting, and for `sh -c SCRIPT` / `bash -lc SCRIPT` the
    /// script itself).
    #[serde(default)]
    pub commands: Vec<String>,
    /// Hosts (network rule syntax: `example.com`, `*.example.com`, `example.com:443`) that
    /// no allow rule admits but that should be asked about rather than refused: a
    /// connection to one is held until approved (the decision then holds for the host and
    /// port for the sandbox's life).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Seconds a held request waits for a decision before it is refused (default 300, at
    /// most 86400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Whether the key that asked may approve its own request (default: no).
    #[serde(default)]
    pub allow_self_approval: bool,
}

/// A request held for approval (`GET /v1/approvals`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApprovalInfo {
    /// Its id (`ap_` and 24 hex digits).
    pub id: String,
    /// The sandbox it is for.
    pub sandbox_id: String,
    /// What is held: `command` or `host`.
    pub kind: String,
    /// The exact command line, or `host:port`.
    pub request: String,
    /// SHA-256 (hex) of the request as made (argv, cwd, user, env names, stdin, PTY): the
    /// approval is bound to it.
    pub digest: String,
    /// The policy's pattern it matched.
    pub rule: String,
    /// Who asked, as the record names callers.
    pub requested_by: String,
    /// When, RFC 3339.
    pub requested_at: String,
    /// When it is refused if nobody decides, RFC 3339.
    pub expires_at: String,
    /// The tenant of the sandbox (none: the node's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// Body of `POST /v1/approvals/{id}/approve` and `/deny`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Decide {
    /// Why (recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A decision (`POST /v1/approvals/{id}/approve` and `/deny` answer it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Decision {
    /// The approval.
    pub id: String,
    /// `approved`, `denied` or `timed_out`.
    pub decision: String,
    /// Who decided (`node` for a timeout).
    pub by: String,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The texts a command line is matched as by a policy's `commands` patterns: its argv
/// joined with shell quoting, and for a shell given a script (`sh -c S`, `bash -lc S`, ...)
/// the script and each command in it ([`script_commands`]), so that `^rm( |$)` holds
/// `sh -c "cd /x && rm -rf y"` too. (The daemon holds by these; a verifier checks by them.)
pub fn command_lines(argv: &[String]) -> Vec<String> {
    let mut out = vec![shell_join(argv)];
    let shell = argv.first().map(|p| p.rsplit('/').next().unwrap_or(p));
    if matches!(shell, Some("sh" | "bash" | "dash" | "zsh" | "ash")) {
        if let Some(i) = argv
            .iter()
            .position(|a| a.starts_with('-') && !a.starts_with("--") && a.contains('c'))
        {
            if let Some(script) = argv.get(i + 1) {
                out.push(script.clone());
                for c in script_commands(script) {
                    if !out.contains(&c) {
                        out.push(c);
                    }
                }
            }
        }
    }
    out
}

/// The commands of a shell script, as far as a reading without a shell goes: the text
/// between the separators `;` `&` `|` (so `&&`, `||`), newlines, `(` `)` `{` `}` `` ` ``
/// and `$(`, outside single and double quotes, trimmed, without the keywords that begin a
/// compound command's body (`then`, `do`, `else`, `!`...). A script can still hide a
/// command from it (`eval`, variables, a script file): see the API reference.
pub fn script_commands(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut chars = script.chars().peekable();
    let flush = |cur: &mut String, out: &mut Vec<String>| {
        let mut t = cur.trim();
        loop {
            let before = t;
            for kw in [
                "then", "do", "else", "elif", "if", "while", "until", "!", "time",
            ] {
                if let Some(rest) = t.strip_prefix(kw) {
                    if rest.starts_with(char::is_whitespace) {
                        t = rest.trim_start();
                    }
                }
            }
            if t == before {
                break;
            }
        }
        if !t.is_empty() {
            out.push(t.to_owned());
        }
        cur.clear();
    };
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                if c == q {
                    quote = None;
                } else if c == '\\' && q == '"' {
                    cur.push(c);
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                    continue;
                }
                cur.push(c);
            }
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    cur.push(c);
                }
                '\\' => {
                    cur.push(c);
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                }
                ';' | '&' | '|' | '\n' | '(' | ')' | '{' | '}' | '`' => flush(&mut cur, &mut out),
                '$' if chars.peek() == Some(&'(') => {
                    chars.next();
                    flush(&mut cur, &mut out);
                }
                _ => cur.push(c),
            },
        }
    }
    flush(&mut cur, &mut out);
    out
}

/// `argv` joined as a POSIX shell would read it back: words of safe characters as they are,
/// the rest in single quotes.
pub fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"@%+=:,./-_".contains(&b))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scripts_commands_are_matched_one_by_one() {
        assert_eq!(
            script_commands(
                "cd /x && rm -rf y; echo 'a; rm no' | tee \"b && c\"\nif true; then rm z; fi"
            ),
            vec![
                "cd /x",
                "rm -rf y",
                "echo 'a; rm no'",
                "tee \"b && c\"",
                "true",
                "rm z",
                "fi"
            ]
        );
        assert_eq!(
            script_commands("x=$(rm -v q) `rm w`"),
            vec!["x=", "rm -v q", "rm w"]
        );
        let argv: Vec<String> = ["sh", "-c", "echo hi; rm -v /tmp/t"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let lines = command_lines(&argv);
        assert!(lines.contains(&"rm -v /tmp/t".to_string()), "{lines:?}");
    }
}
