//! `rampart desktop`: a desktop sandbox's screen and input, and its browser
//! (docs/desktop.md): `screenshot ID [-o FILE]`, `click ID X Y [--button B] [--count N]`,
//! `move ID X Y`, `type ID TEXT`, `key ID KEY...`, `scroll ID [up|down] [N]`,
//! `browser ID [--json]`.

use crate::client::Client;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use rampart_types::desktop::{BrowserInfo, Button, DesktopAction, ScrollDirection};
use reqwest::Method;
use std::path::PathBuf;

/// `rampart desktop`.
#[derive(Debug, Args)]
pub struct DesktopArgs {
    #[command(subcommand)]
    what: What,
    /// The X display (default `:0`).
    #[arg(long, global = true)]
    display: Option<String>,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Save a PNG of the screen (recorded in the sandbox's audit record).
    Screenshot {
        /// The sandbox.
        id: String,
        /// Where (default `<id>-screenshot.png`; `-` for stdout).
        #[arg(short = 'o', long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Click (after moving the pointer to X Y).
    Click {
        /// The sandbox.
        id: String,
        /// X.
        x: u32,
        /// Y.
        y: u32,
        /// left, middle or right.
        #[arg(long, default_value = "left", value_parser = parse_button)]
        button: Button,
        /// Clicks (2: a double click).
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
    /// Move the pointer.
    Move {
        /// The sandbox.
        id: String,
        /// X.
        x: u32,
        /// Y.
        y: u32,
    },
    /// Type text (the record keeps its length and digest only).
    Type {
        /// The sandbox.
        id: String,
        /// The text.
        text: String,
    },
    /// Press keys or chords (`Return`, `ctrl+c`), in order.
    Key {
        /// The sandbox.
        id: String,
        /// The keys.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Turn the wheel.
    Scroll {
        /// The sandbox.
        id: String,
        /// up or down.
        #[arg(default_value = "down", value_parser = parse_direction)]
        direction: ScrollDirection,
        /// Steps.
        #[arg(default_value_t = 1)]
        amount: u32,
    },
    /// Start the sandbox's browser (or find it) and print its DevTools endpoints.
    Browser {
        /// The sandbox.
        id: String,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn parse_button(s: &str) -> Result<Button, String> {
    match s {
        "left" => Ok(Button::Left),
        "middle" => Ok(Button::Middle),
        "right" => Ok(Button::Right),
        _ => Err(format!("{s:?}: use left, middle or right")),
    }
}

fn parse_direction(s: &str) -> Result<ScrollDirection, String> {
    match s {
        "up" => Ok(ScrollDirection::Up),
        "down" => Ok(ScrollDirection::Down),
        _ => Err(format!("{s:?}: use up or down")),
    }
}

/// `rampart desktop`.
pub async fn desktop(host: &crate::client::Endpoint, a: DesktopArgs) -> Result<u8> {
    let client = Client::new(host)?;
    let q = a
        .display
        .as_deref()
        .map(|d| format!("?display={}", super::encode_query(d)))
        .unwrap_or_default();
    let (id, action) = match a.what {
        What::Screenshot { id, output } => {
            let resp = client
                .send(client.request(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/desktop/screenshot{q}"),
                ))
                .await?;
            let png = resp.bytes().await.context("reading the screenshot")?;
            match output.as_deref().and_then(|p| p.to_str()) {
                Some("-") => {
                    use std::io::Write as _;
                    std::io::stdout().write_all(&png)?;
                }
                _ => {
                    let p = output.unwrap_or_else(|| PathBuf::from(format!("{id}-screenshot.png")));
                    std::fs::write(&p, &png).with_context(|| format!("writing {}", p.display()))?;
                    eprintln!("{} ({} bytes)", p.display(), png.len());
                }
            }
            return Ok(0);
        }
        What::Browser { id, json } => {
            let b: BrowserInfo = client
                .json(client.request(Method::POST, &format!("/v1/sandboxes/{id}/browser{q}")))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&b)?);
            } else {
                println!(
                    "{} ({}) on port {} inside\ncdp_url: {}\nws_url:  {}\nsend the sandbox's access token as X-Rampart-Token (rampart info {id})",
                    b.version,
                    if b.headed { "on the desktop" } else { "headless" },
                    b.port,
                    b.cdp_url,
                    b.ws_url
                );
            }
            return Ok(0);
        }
        What::Click {
            id,
            x,
            y,
            button,
            count,
        } => (
            id,
            DesktopAction::Click {
                x: Some(x),
                y: Some(y),
                button,
                count: Some(count),
            },
        ),
        What::Move { id, x, y } => (id, DesktopAction::Move { x, y }),
        What::Type { id, text } => (id, DesktopAction::Type { text }),
        What::Key { id, keys } => (id, DesktopAction::Key { keys }),
        What::Scroll {
            id,
            direction,
            amount,
        } => (
            id,
            DesktopAction::Scroll {
                direction,
                amount: Some(amount),
            },
        ),
    };
    client
        .send(
            client
                .request(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/desktop/actions{q}"),
                )
                .json(&action),
        )
        .await?;
    Ok(0)
}
