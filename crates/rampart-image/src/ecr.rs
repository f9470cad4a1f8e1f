//! Amazon ECR's registry login: an access key is exchanged for a registry password with
//! ECR's `GetAuthorizationToken`, a JSON call signed with AWS Signature Version 4. The
//! password then logs in to the registry as user `AWS` (what `aws ecr get-login-password`
//! gives).

use crate::credentials::Credentials;
use crate::digest::hex;
use crate::ImageError;
use hmac::{Hmac, Mac};
use sha2::{Digest as _, Sha256};

/// An AWS access key and the region of the registry. Never printed.
#[derive(Clone)]
pub struct AwsKeys {
    /// `AKIA...`.
    pub access_key_id: String,
    /// The secret.
    pub secret_access_key: String,
    /// `us-east-1`.
    pub region: String,
}

impl std::fmt::Debug for AwsKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AwsKeys({:?}, <secret>, {:?})",
            self.access_key_id, self.region
        )
    }
}

fn reg(m: impl Into<String>) -> ImageError {
    ImageError::Registry(m.into())
}

impl AwsKeys {
    /// Checks the fields (the region becomes part of a host name).
    pub fn check(&self) -> Result<(), ImageError> {
        let region_ok = !self.region.is_empty()
            && self.region.len() <= 32
            && self
                .region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !region_ok {
            return Err(reg(format!(
                "ECR: {:?} is not an AWS region (e.g. us-east-1)",
                self.region
            )));
        }
        if self.access_key_id.is_empty() || self.secret_access_key.is_empty() {
            return Err(reg(
                "ECR: an access key id and a secret access key are needed",
            ));
        }
        Ok(())
    }

    /// ECR's API endpoint of the region.
    pub fn endpoint(&self) -> String {
        format!("https://api.ecr.{}.amazonaws.com/", self.region)
    }
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any size");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// The `Authorization` value of a Signature Version 4 request: `headers` are the signed ones
/// (lower-case names, trimmed values, `host` and `x-amz-date` among them), `query` is already
/// canonical (sorted, encoded), `amz_date` is `YYYYMMDDTHHMMSSZ`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn authorization(
    keys: &AwsKeys,
    service: &str,
    method: &str,
    path: &str,
    query: &str,
    headers: &[(&str, &str)],
    payload: &[u8],
    amz_date: &str,
) -> String {
    let mut hs: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    hs.sort();
    let canonical_headers: String = hs.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed: Vec<&str> = hs.iter().map(|(k, _)| k.as_str()).collect();
    let signed = signed.join(";");
    let canonical = format!(
        "{method}\n{path}\n{query}\n{canonical_headers}\n{signed}\n{}",
        hex(&Sha256::digest(payload))
    );
    let date = &amz_date[..amz_date.len().min(8)];
    let scope = format!("{date}/{}/{service}/aws4_request", keys.region);
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let k = hmac(
        format!("AWS4{}", keys.secret_access_key).as_bytes(),
        date.as_bytes(),
    );
    let k = hmac(&k, keys.region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    let k = hmac(&k, b"aws4_request");
    let sig = hex(&hmac(&k, to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={sig}",
        keys.access_key_id
    )
}

/// `YYYYMMDDTHHMMSSZ` of now.
fn amz_now() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

const TARGET: &str = "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken";
const CONTENT_TYPE: &str = "application/x-amz-json-1.1";

/// Calls `GetAuthorizationToken` at `endpoint` with `client` and returns the registry login
/// it gives (user `AWS`). `keys` are checked ([`AwsKeys::check`]) by the caller.
pub(crate) async fn login(
    client: &reqwest::Client,
    endpoint: &reqwest::Url,
    keys: &AwsKeys,
) -> Result<Credentials, ImageError> {
    let host = match (endpoint.host_str(), endpoint.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_owned(),
        (None, _) => return Err(reg(format!("ECR endpoint {endpoint} has no host"))),
    };
    let body = b"{}";
    let date = amz_now();
    let auth = authorization(
        keys,
        "ecr",
        "POST",
        endpoint.path(),
        "",
        &[
            ("content-type", CONTENT_TYPE),
            ("host", &host),
            ("x-amz-date", &date),
            ("x-amz-target", TARGET),
        ],
        body,
        &date,
    );
    let r = client
        .post(endpoint.clone())
        .header("content-type", CONTENT_TYPE)
        .header("x-amz-date", &date)
        .header("x-amz-target", TARGET)
        .header("authorization", auth)
        .body(&body[..])
        .send()
        .await
        .map_err(|e| reg(format!("ECR: cannot reach {endpoint}: {e}")))?;
    let status = r.status();
    let text = r.text().await.unwrap_or_default();
    if !status.is_success() {
        // AWS's JSON errors: {"__type": "...", "message": "..."}.
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let kind = v
            .get("__type")
            .and_then(|t| t.as_str())
            .unwrap_or("")
            .rsplit('#')
            .next()
            .unwrap_or("");
        let msg = v
            .get("message")
            .or_else(|| v.get("Message"))
            .and_then(|t| t.as_str())
            .unwrap_or("");
        return Err(reg(format!(
            "ECR refused the access key ({status}{}{kind}{}{msg})",
            if kind.is_empty() { "" } else { ": " },
            if msg.is_empty() { "" } else { ": " }
        )));
    }
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| reg(format!("ECR: the token answer: {e}")))?;
    let token = v
        .get("authorizationData")
        .and_then(|d| d.get(0))
        .and_then(|d| d.get("authorizationToken"))
        .and_then(|t| t.as_str())
        .ok_or_else(|| reg("ECR: the token answer has no authorizationToken"))?;
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| reg("ECR: the authorizationToken is not base64 text"))?;
    let (username, password) = decoded
        .split_once(':')
        .ok_or_else(|| reg("ECR: the authorizationToken is not USER:PASSWORD"))?;
    Ok(Credentials {
        username: username.to_owned(),
        password: password.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> AwsKeys {
        AwsKeys {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            region: "us-east-1".into(),
        }
    }

    #[test]
    fn signatures_match_the_aws_test_suite() {
        let date = "20150830T123600Z";
        let h = [("host", "example.amazonaws.com"), ("x-amz-date", date)];
        // get-vanilla.
        assert_eq!(
            authorization(&example(), "service", "GET", "/", "", &h, b"", date),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
        // get-vanilla-query-order-key-case (the query given sorted).
        assert!(authorization(
            &example(),
            "service",
            "GET",
            "/",
            "Param1=value1&Param2=value2",
            &h,
            b"",
            date
        )
        .ends_with("b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"));
        // The header order given does not matter.
        let rev = [h[1], h[0]];
        assert_eq!(
            authorization(&example(), "service", "GET", "/", "", &rev, b"", date),
            authorization(&example(), "service", "GET", "/", "", &h, b"", date)
        );
    }

    #[test]
    fn regions_are_checked_and_secrets_not_printed() {
        let mut k = example();
        assert!(k.check().is_ok());
        assert_eq!(k.endpoint(), "https://api.ecr.us-east-1.amazonaws.com/");
        assert!(!format!("{k:?}").contains("EXAMPLEKEY"));
        k.region = "evil.com/x".into();
        assert!(k.check().is_err());
    }
}
