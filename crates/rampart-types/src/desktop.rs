//! A sandbox's desktop (the `desktop` template: an X server, Xfce, xdotool, scrot, Chromium)
//! driven through the native API: actions, screenshots, and a browser whose DevTools
//! protocol is reached through the daemon.

use serde::{Deserialize, Serialize};

/// A mouse button.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Button {
    /// Button 1.
    #[default]
    Left,
    /// Button 2.
    Middle,
    /// Button 3.
    Right,
}

impl Button {
    /// X's number of the button.
    pub fn number(self) -> u8 {
        match self {
            Button::Left => 1,
            Button::Middle => 2,
            Button::Right => 3,
        }
    }
}

/// Which way to scroll.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScrollDirection {
    /// Wheel up (button 4).
    Up,
    /// Wheel down (button 5).
    #[default]
    Down,
}

/// One action on a sandbox's desktop (`POST /v1/sandboxes/{id}/desktop/actions`). Each runs
/// `xdotool` in the sandbox on the display and is recorded as a `desktop` event (typed text
/// as its length and digest only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum DesktopAction {
    /// Moves the pointer to `x`,`y` (if given), then clicks `button` `count` times.
    Click {
        /// Where (with `y`); the pointer's place when absent.
        #[serde(default)]
        x: Option<u32>,
        /// Where (with `x`).
        #[serde(default)]
        y: Option<u32>,
        /// The button (default left).
        #[serde(default)]
        button: Button,
        /// How many clicks (default 1; 2 for a double click; at most 10).
        #[serde(default)]
        count: Option<u32>,
    },
    /// Moves the pointer.
    Move {
        /// X, pixels from the left.
        x: u32,
        /// Y, pixels from the top.
        y: u32,
    },
    /// Presses a button and holds it.
    MouseDown {
        /// The button (default left).
        #[serde(default)]
        button: Button,
    },
    /// Releases a button.
    MouseUp {
        /// The button (default left).
        #[serde(default)]
        button: Button,
    },
    /// Drags from one point to another with the left button.
    Drag {
        /// Start, `[x, y]`.
        from: [u32; 2],
        /// End, `[x, y]`.
        to: [u32; 2],
    },
    /// Turns the wheel.
    Scroll {
        /// Up or down (default down).
        #[serde(default)]
        direction: ScrollDirection,
        /// How many steps (default 1; at most 100).
        #[serde(default)]
        amount: Option<u32>,
    },
    /// Presses keys: each entry one key or a chord (`Return`, `ctrl+c`, X keysym names).
    Key {
        /// The keys, pressed in order.
        keys: Vec<String>,
    },
    /// Types text (kept in the record as its length and digest only).
    Type {
        /// The text.
        text: String,
    },
}

/// A browser running in a sandbox with its DevTools protocol reachable through the daemon
/// (`POST /v1/sandboxes/{id}/browser`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserInfo {
    /// The port its DevTools protocol listens on inside the sandbox (127.0.0.1).
    pub port: u16,
    /// Whether it shows on the sandbox's display (else it runs headless).
    pub headed: bool,
    /// The pid of its process (a background process of the sandbox, tag `browser`).
    pub pid: Option<u32>,
    /// The browser's version, as its DevTools protocol names it.
    pub version: String,
    /// The path of the browser's own WebSocket (`/devtools/browser/<id>`).
    pub ws_path: String,
    /// The DevTools endpoint for `connect_over_cdp` (Playwright) or `puppeteer.connect`
    /// (`browserURL`): send the sandbox's access token with it (`X-Rampart-Token`).
    /// Filled in by the server.
    #[serde(default)]
    pub cdp_url: String,
    /// The browser's own WebSocket endpoint through the daemon (`browserWSEndpoint`).
    /// Filled in by the server.
    #[serde(default)]
    pub ws_url: String,
}
