//! The in-sandbox agent and its host-side client.
//!
//! The agent is PID 1 of every sandbox. It speaks the envd-compatible protocol (Connect RPC,
//! JSON codec, HTTP/1.1): `process.Process`, `filesystem.Filesystem`, `GET/POST /files`,
//! `GET /health`, on a Unix socket. `GET /info` answers `{"version":"<crate version>",
//! "protocol":1}` ([`proto::PROTOCOL_VERSION`]); every response carries an
//! `x-rampart-agent-version` header.

pub mod client;
pub mod connect;
pub mod proto;
pub mod server;
