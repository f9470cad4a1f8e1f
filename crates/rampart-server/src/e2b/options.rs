//! What the E2B API keeps about a sandbox besides core's policy: its [`Options`] (JSON in
//! the sandbox's E2B facts), read by the control plane, the envd proxy, forks and volumes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The timeout E2B's SDKs give a sandbox when none is asked for (seconds).
pub(super) const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// What the E2B API keeps about a sandbox besides core's policy (JSON in its E2B facts).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Options {
    /// The `network` as the info endpoint shows it (header values left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) network: Option<Value>,
    /// `allow_internet_access` as given at create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) allow_internet_access: Option<bool>,
    /// Every port but envd's and the code interpreter's answers without the traffic token
    /// ([`Options::is_public`]). Absent in the JSON of a sandbox made before the default
    /// was E2B's: private, as it was made.
    #[serde(default)]
    pub(crate) allow_public_traffic: bool,
    /// The `Host` sent to the sandbox's ports (`${PORT}` stands for the port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) mask_request_host: Option<String>,
    /// A paused sandbox resumes on the first request for it.
    #[serde(default)]
    pub(crate) auto_resume: bool,
    /// `autoPause`: paused, not killed, at its timeout.
    #[serde(default)]
    pub(crate) auto_pause: bool,
    /// The create's `timeout` (seconds), which an auto-resume gives the sandbox again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) timeout: Option<u64>,
    /// `httpsPorts`: ports whose server speaks TLS itself; the proxy reaches them over TLS
    /// (the certificate not verified, as E2B's proxy does).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) https_ports: Vec<u16>,
    /// The create's `volumeMounts` (name, path), as info shows them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) volume_mounts: Vec<Mount>,
}

impl Options {
    pub(crate) fn parse(s: &str) -> Options {
        if s.is_empty() {
            return Options::default();
        }
        serde_json::from_str(s).unwrap_or_default()
    }
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
    /// Whether `port` answers without the sandbox's token: with `allowPublicTraffic`, every
    /// port but envd's (49983) and the code interpreter's (49999), which run commands and
    /// code and so always need the token (the SDKs always send it).
    pub(crate) fn is_public(&self, port: u16) -> bool {
        self.allow_public_traffic
            && port != super::envd::ENVD_PORT
            && port != super::envd::JUPYTER_PORT
    }
    /// The `Host` header for a request to `port`, when a mask is set.
    pub(crate) fn host_for(&self, port: u16) -> Option<String> {
        self.mask_request_host
            .as_ref()
            .map(|m| m.replace("${PORT}", &port.to_string()))
    }
}

/// A volume mounted at create (`SandboxVolumeMount`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Mount {
    /// The volume's name (its E2B id).
    pub(crate) name: String,
    /// Absolute path inside the sandbox.
    pub(crate) path: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_name_the_port() {
        let o = Options {
            mask_request_host: Some("${PORT}-app.example.com".into()),
            ..Default::default()
        };
        assert_eq!(o.host_for(8080).as_deref(), Some("8080-app.example.com"));
        let back = Options::parse(&o.to_json());
        assert_eq!(back.mask_request_host, o.mask_request_host);
        assert!(!Options::parse("").auto_resume);
    }

    #[test]
    fn public_traffic_leaves_envd_and_the_interpreter_private() {
        let o = Options {
            allow_public_traffic: true,
            ..Default::default()
        };
        assert!(o.is_public(8080) && o.is_public(6080));
        assert!(!o.is_public(49983) && !o.is_public(49999));
        assert!(!Options::default().is_public(8080));
        // A sandbox recorded before the default changed stays as it was made.
        assert!(!Options::parse(r#"{"autoResume":false}"#).is_public(8080));
    }
}
