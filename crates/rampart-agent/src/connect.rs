//! Connect protocol pieces shared by the agent and its client: error codes, envelopes.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Envelope flag: end of stream.
pub const FLAG_END_STREAM: u8 = 0x02;
/// Envelope flag: compressed payload (never used; rejected).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Largest envelope payload accepted.
pub const MAX_ENVELOPE: usize = 16 << 20;

/// Connect error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// `canceled`.
    Canceled,
    /// `unknown`.
    Unknown,
    /// `invalid_argument`.
    InvalidArgument,
    /// `deadline_exceeded`.
    DeadlineExceeded,
    /// `not_found`.
    NotFound,
    /// `already_exists`.
    AlreadyExists,
    /// `permission_denied`.
    PermissionDenied,
    /// `resource_exhausted`.
    ResourceExhausted,
    /// `failed_precondition`.
    FailedPrecondition,
    /// `aborted`.
    Aborted,
    /// `out_of_range`.
    OutOfRange,
    /// `unimplemented`.
    Unimplemented,
    /// `internal`.
    Internal,
    /// `unavailable`.
    Unavailable,
    /// `data_loss`.
    DataLoss,
    /// `unauthenticated`.
    Unauthenticated,
}

impl Code {
    /// The Connect code string.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// HTTP status of a unary error with this code (Connect mapping).
    pub fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        }
    }

    /// The Connect code for a plain HTTP status (as the SDK maps non-Connect errors).
    pub fn from_http_status(status: u16) -> Code {
        match status {
            400 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            409 => Code::AlreadyExists,
            413 | 429 | 507 => Code::ResourceExhausted,
            499 => Code::Canceled,
            500 => Code::Internal,
            501 => Code::Unimplemented,
            502 | 503 => Code::Unavailable,
            504 => Code::DeadlineExceeded,
            _ => Code::Unknown,
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An RPC failure, sent as a Connect error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct RpcError {
    /// Code.
    pub code: Code,
    /// Human-readable message.
    pub message: String,
}

impl RpcError {
    /// A new error.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
        }
    }
    /// `{"code":"…","message":"…"}`.
    pub fn to_json(&self) -> Bytes {
        #[derive(Serialize)]
        struct E<'a> {
            code: &'a str,
            message: &'a str,
        }
        serde_json::to_vec(&E {
            code: self.code.as_str(),
            message: &self.message,
        })
        .unwrap_or_default()
        .into()
    }
}

/// Encode one envelope.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(flags);
    b.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    b.put_slice(payload);
    b.freeze()
}

/// Encode a message envelope holding `msg` as JSON.
pub fn message_envelope<T: Serialize>(msg: &T) -> Bytes {
    envelope(
        0,
        &serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// Encode the end-of-stream envelope: `{}` or `{"error":{…}}`.
pub fn end_envelope(err: Option<&RpcError>) -> Bytes {
    match err {
        None => envelope(FLAG_END_STREAM, b"{}"),
        Some(e) => {
            let mut v = b"{\"error\":".to_vec();
            v.extend_from_slice(&e.to_json());
            v.push(b'}');
            envelope(FLAG_END_STREAM, &v)
        }
    }
}

/// Errors decoding envelopes.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EnvelopeError {
    /// The envelope is compressed, which was not negotiated.
    #[error("compressed envelopes are not supported")]
    Compressed,
    /// The envelope is larger than allowed.
    #[error("envelope of {0} bytes is too large")]
    TooLarge(usize),
    /// The stream ended inside an envelope.
    #[error("truncated envelope")]
    Truncated,
}

/// Take one complete envelope `(flags, payload)` off the front of `buf`, if there is one.
pub fn take_envelope(buf: &mut BytesMut) -> Result<Option<(u8, Bytes)>, EnvelopeError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let flags = buf[0];
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if flags & FLAG_COMPRESSED != 0 {
        return Err(EnvelopeError::Compressed);
    }
    if len > MAX_ENVELOPE {
        return Err(EnvelopeError::TooLarge(len));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    buf.advance(5);
    Ok(Some((flags, buf.split_to(len).freeze())))
}

/// Decode one JSON-codec message (a unary request body, or the payload of an envelope).
/// An empty or all-whitespace body is the empty message, as Connect sends it.
pub fn decode_json<T: DeserializeOwned>(b: &[u8]) -> Result<T, RpcError> {
    if b.iter().all(u8::is_ascii_whitespace) {
        return serde_json::from_slice(b"{}")
            .map_err(|e| RpcError::new(Code::InvalidArgument, e.to_string()));
    }
    serde_json::from_slice(b)
        .map_err(|e| RpcError::new(Code::InvalidArgument, format!("invalid request: {e}")))
}

/// Decode the body of a server-streaming request: one message envelope (what follows it is
/// ignored), never an end-of-stream one.
pub fn decode_stream_request<T: DeserializeOwned>(raw: &[u8]) -> Result<T, RpcError> {
    let mut buf = BytesMut::from(raw);
    match take_envelope(&mut buf) {
        Ok(Some((flags, payload))) if flags & FLAG_END_STREAM == 0 => decode_json(&payload),
        Ok(_) => Err(RpcError::new(
            Code::InvalidArgument,
            "request has no message envelope",
        )),
        Err(e) => Err(RpcError::new(Code::InvalidArgument, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_roundtrip() {
        let mut b = BytesMut::new();
        b.extend_from_slice(&envelope(0, b"{\"a\":1}"));
        b.extend_from_slice(&end_envelope(Some(&RpcError::new(Code::NotFound, "x"))));
        b.extend_from_slice(&[0, 0]);
        let (f, p) = take_envelope(&mut b).expect("ok").expect("some");
        assert_eq!((f, &p[..]), (0, &b"{\"a\":1}"[..]));
        let (f, p) = take_envelope(&mut b).expect("ok").expect("some");
        assert_eq!(f, FLAG_END_STREAM);
        assert_eq!(&p[..], br#"{"error":{"code":"not_found","message":"x"}}"#);
        assert!(take_envelope(&mut b).expect("ok").is_none());
        assert_eq!(&end_envelope(None)[..], b"\x02\0\0\0\x02{}");
        let mut c = BytesMut::from(&[1u8, 0, 0, 0, 0][..]);
        assert!(take_envelope(&mut c).is_err());
    }
}
