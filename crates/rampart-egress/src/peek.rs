//! Recognizing the first bytes of a connection: a TLS ClientHello (and its SNI) or an HTTP/1
//! request (and its Host header). Pure parsing of untrusted bytes; never panics.

use crate::policy::normalize_name;

/// What the first bytes of a connection are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peek {
    /// Not enough bytes yet to tell.
    NeedMore,
    /// A TLS ClientHello; the SNI host name if it carries one.
    Tls(Option<String>),
    /// An HTTP/1 request; the Host header's name (not an IP literal) if any.
    Http(Option<String>),
    /// Something else (raw TCP).
    Other,
}

/// Classifies the bytes read so far.
pub fn classify(buf: &[u8]) -> Peek {
    match buf.first() {
        None => Peek::NeedMore,
        Some(0x16) => tls(buf),
        Some(b) if b.is_ascii_uppercase() => http(buf),
        Some(_) => Peek::Other,
    }
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.b.len() < n {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| b[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| ((b[0] as usize) << 8) | b[1] as usize)
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| ((b[0] as usize) << 16) | ((b[1] as usize) << 8) | b[2] as usize)
    }
}

fn tls(buf: &[u8]) -> Peek {
    // Gather the handshake bytes from consecutive handshake records.
    let mut hs = Vec::new();
    let mut rest = buf;
    loop {
        if rest.len() < 5 {
            break;
        }
        if rest[0] != 0x16 || rest[1] != 0x03 {
            return if hs.is_empty() {
                Peek::Other
            } else {
                Peek::Tls(None)
            };
        }
        let len = ((rest[3] as usize) << 8) | rest[4] as usize;
        if len == 0 || len > 16384 + 2048 {
            return Peek::Other;
        }
        if rest.len() < 5 + len {
            hs.extend_from_slice(&rest[5..]);
            break;
        }
        hs.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
        if hs.len() >= 4 {
            let need = 4 + (((hs[1] as usize) << 16) | ((hs[2] as usize) << 8) | hs[3] as usize);
            if hs.len() >= need {
                break;
            }
        }
    }
    if buf.len() >= 2 && buf[1] != 0x03 {
        return Peek::Other;
    }
    let mut r = Reader { b: &hs };
    let Some(ty) = r.u8() else {
        return Peek::NeedMore;
    };
    if ty != 1 {
        return Peek::Other;
    }
    let Some(len) = r.u24() else {
        return Peek::NeedMore;
    };
    if len > 65536 {
        return Peek::Other;
    }
    let Some(body) = r.take(len) else {
        return Peek::NeedMore;
    };
    Peek::Tls(client_hello_sni(body))
}

fn client_hello_sni(body: &[u8]) -> Option<String> {
    let mut r = Reader { b: body };
    r.take(2 + 32)?; // version, random
    let sid = r.u8()?;
    r.take(sid)?;
    let cs = r.u16()?;
    r.take(cs)?;
    let comp = r.u8()?;
    r.take(comp)?;
    let ext_len = r.u16()?;
    let mut ext = Reader {
        b: r.take(ext_len)?,
    };
    while let Some(ty) = ext.u16() {
        let l = ext.u16()?;
        let data = ext.take(l)?;
        if ty != 0 {
            continue;
        }
        let mut d = Reader { b: data };
        let list = d.u16()?;
        let mut names = Reader { b: d.take(list)? };
        while let Some(kind) = names.u8() {
            let nl = names.u16()?;
            let name = names.take(nl)?;
            if kind == 0 {
                return std::str::from_utf8(name).ok().and_then(normalize_name);
            }
        }
        return None;
    }
    None
}

fn http(buf: &[u8]) -> Peek {
    // A method token then a space; anything else is not HTTP.
    let tok = buf.iter().take_while(|b| b.is_ascii_uppercase()).count();
    if tok == buf.len() {
        return if tok < 16 {
            Peek::NeedMore
        } else {
            Peek::Other
        };
    }
    if tok > 15 || buf[tok] != b' ' {
        return Peek::Other;
    }
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Peek::NeedMore,
        Ok(httparse::Status::Complete(_)) => Peek::Http(
            req.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("host"))
                .and_then(|h| std::str::from_utf8(h.value).ok())
                .and_then(host_name),
        ),
        Err(_) => Peek::Other,
    }
}

/// The name in a Host header value (`example.com:8080` -> `example.com`); `None` for an IP
/// literal or garbage.
pub fn host_name(v: &str) -> Option<String> {
    let v = v.trim();
    if v.starts_with('[') {
        return None;
    }
    let h = match v.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        Some(_) => return None,
        None => v,
    };
    if h.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    normalize_name(h)
}

/// What a `Host` header value or a request target's authority names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostId {
    /// A host name (normalized: lowercase, no trailing dot).
    Name(String),
    /// An IP literal (`203.0.113.7`, `[2001:db8::1]`).
    Addr(std::net::IpAddr),
}

/// Parses an authority (`host`, `host:port`, `[v6]`, `[v6]:port`; no user info). `None` when it
/// is not one: more than one colon outside brackets, a port that is not a number up to
/// 65535, characters a host name cannot have. Stricter than [`host_name`], which is only
/// about finding a name.
pub fn parse_host(v: &str) -> Option<HostId> {
    let v = v.trim_matches([' ', '\t']);
    let port_ok = |p: &str| p.is_empty() || (p.len() <= 5 && p.parse::<u16>().is_ok());
    if let Some(rest) = v.strip_prefix('[') {
        let (inner, after) = rest.split_once(']')?;
        if !after.is_empty() && !port_ok(after.strip_prefix(':')?) {
            return None;
        }
        return inner
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .map(|a| HostId::Addr(std::net::IpAddr::V6(a)));
    }
    let h = match v.split_once(':') {
        Some((h, p)) if port_ok(p) => h,
        Some(_) => return None,
        None => v,
    };
    if let Ok(a) = h.parse::<std::net::Ipv4Addr>() {
        return Some(HostId::Addr(std::net::IpAddr::V4(a)));
    }
    normalize_name(h).map(HostId::Name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello with the given SNI, in one record.
    pub(crate) fn client_hello(sni: &str) -> Vec<u8> {
        let name = sni.as_bytes();
        let mut sni_ext = Vec::new();
        sni_ext.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
        sni_ext.push(0);
        sni_ext.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sni_ext.extend_from_slice(name);
        let mut exts = Vec::new();
        exts.extend_from_slice(&[0x00, 0x0b, 0x00, 0x02, 0x01, 0x00]); // ec_point_formats
        exts.extend_from_slice(&[0x00, 0x00]);
        exts.extend_from_slice(&(sni_ext.len() as u16).to_be_bytes());
        exts.extend_from_slice(&sni_ext);
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0);
        body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]);
        body.extend_from_slice(&[0x01, 0x00]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![0x01];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn tls_sni() {
        let ch = client_hello("Api.Example.com");
        assert_eq!(classify(&ch), Peek::Tls(Some("api.example.com".into())));
        for n in 0..ch.len() {
            assert_eq!(classify(&ch[..n]), Peek::NeedMore, "{n}");
        }
        // Split across two records.
        let hs = &ch[5..];
        let mut two = vec![0x16, 0x03, 0x01, 0x00, 0x10];
        two.extend_from_slice(&hs[..16]);
        two.extend_from_slice(&[0x16, 0x03, 0x01]);
        two.extend_from_slice(&((hs.len() - 16) as u16).to_be_bytes());
        two.extend_from_slice(&hs[16..]);
        assert_eq!(classify(&two), Peek::Tls(Some("api.example.com".into())));
    }

    #[test]
    fn garbage_never_panics() {
        let ch = client_hello("a.example.com");
        for i in 5..ch.len() {
            let mut c = ch.clone();
            c[i] ^= 0xff;
            let _ = classify(&c);
            c.truncate(i);
            let _ = classify(&c);
        }
        assert_eq!(classify(b"\x16\x03\x01\x00\x00"), Peek::Other);
        assert_eq!(classify(b"SSH-2.0-OpenSSH\r\n"), Peek::Other);
        assert_eq!(classify(b"\x00\x01"), Peek::Other);
    }

    #[test]
    fn http_host() {
        assert_eq!(classify(b"GET / HTTP/1.1\r\nHo"), Peek::NeedMore);
        assert_eq!(classify(b"GET"), Peek::NeedMore);
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: Example.com:8080\r\n\r\n"),
            Peek::Http(Some("example.com".into()))
        );
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: 1.2.3.4\r\n\r\n"),
            Peek::Http(None)
        );
        assert_eq!(classify(b"GET / HTTP/1.1\r\n\r\n"), Peek::Http(None));
        assert_eq!(classify(b"HELLO world\r\n"), Peek::Other);
    }

    #[test]
    fn strict_host_parsing() {
        let name = |n: &str| Some(HostId::Name(n.into()));
        assert_eq!(parse_host("Api.Test"), name("api.test"));
        assert_eq!(parse_host("api.test:8443"), name("api.test"));
        assert_eq!(parse_host("api.test:"), name("api.test"));
        assert_eq!(
            parse_host("198.51.100.4:80"),
            Some(HostId::Addr("198.51.100.4".parse().unwrap()))
        );
        assert_eq!(
            parse_host("[2001:db8::1]:443"),
            Some(HostId::Addr("2001:db8::1".parse().unwrap()))
        );
        for bad in [
            "forbidden.example:1:1",
            "a.test:99999",
            "a.test:x",
            "",
            "a b",
            "u@a.test",
            "[::1",
            "[::1]x",
            "2001:db8::1",
            "a.test/x",
        ] {
            assert_eq!(parse_host(bad), None, "{bad}");
        }
    }
}
