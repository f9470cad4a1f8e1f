//! Canonical JSON: one byte string for one JSON value.
//!
//! The encoding is RFC 8785 (JSON Canonicalization Scheme) restricted to the values Rampart
//! records: `null`, booleans, strings, arrays, objects and integers in the range
//! `-(2^53-1) ..= 2^53-1`. Floating-point numbers are refused. In that subset RFC 8785 is
//! simple enough to re-implement in a few lines, and any RFC 8785 library gives the same
//! bytes:
//!
//! - no whitespace anywhere;
//! - object members sorted by their names compared as arrays of UTF-16 code units;
//! - integers in plain decimal (`-` for negatives, no leading zeros, no `+`, no exponent);
//! - strings in double quotes; `"` and `\` escaped as `\"` and `\\`; U+0008, U+0009, U+000A,
//!   U+000C, U+000D as `\b`, `\t`, `\n`, `\f`, `\r`; every other code point below U+0020 as
//!   `\u00xx` with lowercase hex; everything else (including `/`, U+007F and non-ASCII)
//!   as its UTF-8 bytes.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::fmt;

/// The largest integer magnitude the encoding accepts: 2^53 - 1, the last integer every
/// JSON implementation (including JavaScript's) represents exactly.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Errors of encoding a value canonically.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// a floating-point number cannot be encoded canonically
    #[error("a floating-point number ({0}) cannot be encoded canonically; record it as a string")]
    Float(Number),
    /// an integer outside ±(2^53-1) cannot be encoded canonically
    #[error("the integer {0} is outside ±(2^53-1) and cannot be encoded canonically")]
    IntegerOutOfRange(Number),
    /// the value could not be turned into JSON. The text is `serde_json`'s message: its
    /// error is neither `Clone` nor `Eq`, which this error (and the verifier's errors that
    /// carry it) are.
    #[error("the value could not be turned into JSON: {0}")]
    Json(String),
    /// the canonical encoding of an event is not UTF-8 (it always is: a bug)
    #[error("the value could not be turned into JSON: {0}")]
    Utf8(#[from] std::str::Utf8Error),
    /// the canonical encoding of an event has no `prev` member (it always has: a bug)
    #[error("the value could not be turned into JSON: no prev in the encoded event")]
    NoPrev,
}

/// Appends the canonical encoding of `v` to `out`.
pub fn write_canonical(v: &Value, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out)?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| compare_keys(a.0, b.0));
            out.push(b'{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write_canonical(v, out)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// The canonical encoding of `v`.
pub fn to_canonical(v: &Value) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(256);
    write_canonical(v, &mut out)?;
    Ok(out)
}

/// Orders object member names as RFC 8785 does: by UTF-16 code units.
pub fn compare_keys(a: &str, b: &str) -> std::cmp::Ordering {
    if a.is_ascii() && b.is_ascii() {
        a.as_bytes().cmp(b.as_bytes())
    } else {
        a.encode_utf16().cmp(b.encode_utf16())
    }
}

fn write_number(n: &Number, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    if let Some(u) = n.as_u64() {
        if u > MAX_SAFE_INTEGER {
            return Err(EncodeError::IntegerOutOfRange(n.clone()));
        }
        out.extend_from_slice(u.to_string().as_bytes());
    } else if let Some(i) = n.as_i64() {
        if i.unsigned_abs() > MAX_SAFE_INTEGER {
            return Err(EncodeError::IntegerOutOfRange(n.clone()));
        }
        out.extend_from_slice(i.to_string().as_bytes());
    } else {
        return Err(EncodeError::Float(n.clone()));
    }
    Ok(())
}

/// Appends a string in canonical form (quotes included).
pub fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if esc.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 15) as usize]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Makes a free-form JSON value encodable: every non-integer number, and every integer
/// outside ±(2^53-1), becomes a string holding its shortest decimal spelling (`0.5` ->
/// `"0.5"`, `2.0` -> `"2"`). Used on the free-form members of event bodies (`spec`,
/// `policy`, `detail`) before hashing; documented in `docs/proof.md`.
pub fn normalize_numbers(v: &mut Value) {
    match v {
        Value::Number(n) => {
            let ok = match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => u <= MAX_SAFE_INTEGER,
                (None, Some(i)) => i.unsigned_abs() <= MAX_SAFE_INTEGER,
                _ => false,
            };
            if !ok {
                let s = match n.as_f64() {
                    _ if n.is_u64() || n.is_i64() => n.to_string(),
                    Some(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e15 => {
                        format!("{}", f as i64)
                    }
                    Some(f) => format!("{f}"),
                    None => n.to_string(),
                };
                *v = Value::String(s);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_numbers),
        Value::Object(map) => map.iter_mut().for_each(|(_, v)| normalize_numbers(v)),
        _ => {}
    }
}

/// A JSON value read strictly: a duplicate object member name or a floating-point number
/// is an error (a value must have exactly one reading, whoever parses it).
#[derive(Debug, Clone, PartialEq)]
pub struct StrictValue(pub Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value without floating-point numbers or duplicate names")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Err(E::custom(format!(
            "floating-point number {v} is not allowed"
        )))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(StrictValue(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let StrictValue(v) = access.next_value()?;
            if map.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate member name {key:?}")));
            }
            map.insert(key, v);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(v: &Value) -> String {
        String::from_utf8(to_canonical(v).unwrap()).unwrap()
    }

    #[test]
    fn sorts_members_and_drops_whitespace() {
        let v = json!({"b": [1, true, null], "a": {"z": -3, "y": "x"}, "": 0});
        assert_eq!(
            canon(&v),
            r#"{"":0,"a":{"y":"x","z":-3},"b":[1,true,null]}"#
        );
    }

    #[test]
    fn escapes_like_rfc8785() {
        let v = json!("a\"b\\c\u{8}\t\n\u{c}\r\u{1}\u{1f}/\u{7f}é€😀");
        assert_eq!(
            canon(&v),
            "\"a\\\"b\\\\c\\b\\t\\n\\f\\r\\u0001\\u001f/\u{7f}é€😀\""
        );
    }

    #[test]
    fn utf16_member_order() {
        // U+FB33 sorts after U+1F600 in code points but before it in UTF-16 (0xD83D...).
        // RFC 8785 orders by UTF-16: the surrogate pair (0xD83D) comes before 0xFB33.
        let v = json!({"\u{fb33}": 1, "\u{1f600}": 2, "a": 3});
        assert_eq!(canon(&v), "{\"a\":3,\"\u{1f600}\":2,\"\u{fb33}\":1}");
    }

    #[test]
    fn integers_in_range_only_and_no_floats() {
        assert_eq!(canon(&json!(9007199254740991u64)), "9007199254740991");
        assert_eq!(canon(&json!(-9007199254740991i64)), "-9007199254740991");
        assert!(matches!(
            to_canonical(&json!(9007199254740992u64)),
            Err(EncodeError::IntegerOutOfRange(_))
        ));
        assert!(matches!(
            to_canonical(&json!({"x": [0.5]})),
            Err(EncodeError::Float(_))
        ));
    }

    #[test]
    fn normalize_turns_floats_into_strings() {
        let mut v = json!({"cpus": 0.5, "n": 2.0, "big": u64::MAX, "ok": 7});
        normalize_numbers(&mut v);
        assert_eq!(
            v,
            json!({"cpus": "0.5", "n": "2", "big": u64::MAX.to_string(), "ok": 7})
        );
        assert!(to_canonical(&v).is_ok());
    }

    #[test]
    fn strict_values_refuse_duplicates_and_floats() {
        assert!(serde_json::from_str::<StrictValue>(r#"{"a":1,"a":2}"#).is_err());
        assert!(serde_json::from_str::<StrictValue>(r#"[1.5]"#).is_err());
        assert!(serde_json::from_str::<StrictValue>(r#"1e3"#).is_err());
        let v = serde_json::from_str::<StrictValue>(r#"{"a":[1,-2,"x",null,false]}"#).unwrap();
        assert_eq!(v.0, json!({"a": [1, -2, "x", null, false]}));
    }
}
