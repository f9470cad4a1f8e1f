//! A small OCI image layout made from host programs and the libraries they load (found with
//! `ldd`), usr-merged, with `root` and `user` accounts: for benchmarks and tests that must
//! not need a registry or the network.

use crate::{io, ImageError};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Programs of the sample image.
pub const PROGRAMS: &[&str] = &[
    "/usr/bin/dash",
    "/usr/bin/cat",
    "/usr/bin/id",
    "/usr/bin/env",
    "/usr/bin/ls",
    "/usr/bin/echo",
    "/usr/bin/mkdir",
    "/usr/bin/sleep",
    "/usr/bin/true",
];

fn libraries(progs: &[PathBuf]) -> Result<BTreeSet<PathBuf>, ImageError> {
    let mut out = BTreeSet::new();
    for p in progs {
        let o = std::process::Command::new("ldd")
            .arg(p)
            .output()
            .map_err(io("run ldd"))?;
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            let path = l
                .split("=>")
                .nth(1)
                .unwrap_or(l)
                .split_whitespace()
                .next()
                .unwrap_or("");
            if path.starts_with('/') {
                out.insert(PathBuf::from(path));
                if let Ok(real) = std::fs::canonicalize(path) {
                    out.insert(real);
                }
            }
        }
    }
    Ok(out)
}

fn usr_path(p: &Path) -> String {
    let s = p.to_string_lossy();
    let s = s.trim_start_matches('/');
    if s.starts_with("usr/") {
        s.to_owned()
    } else {
        format!("usr/{s}")
    }
}

fn header(kind: tar::EntryType, mode: u32, uid: u64, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid);
    h.set_gid(uid);
    h.set_size(size);
    h.set_mtime(1_700_000_000);
    h
}

/// Writes the sample image as an OCI layout at `dir` (one layer): [`PROGRAMS`] plus
/// the libraries of `extra` host binaries (e.g. the agent, whose libraries must be there).
pub fn write_host_image(dir: &Path, extra: &[PathBuf]) -> Result<(), ImageError> {
    write_host_image_with(dir, extra, &[])
}

/// [`write_host_image`] with a second, gzip-compressed layer holding the host programs
/// `on_top` (their libraries in the first layer).
pub fn write_host_image_with(
    dir: &Path,
    extra: &[PathBuf],
    on_top: &[PathBuf],
) -> Result<(), ImageError> {
    let e = |what: &str| io(format!("sample image: {what}"));
    let mut b = tar::Builder::new(Vec::new());
    for d in [
        "usr/",
        "usr/bin/",
        "usr/lib/",
        "usr/lib64/",
        "etc/",
        "tmp/",
        "root/",
        "home/",
    ] {
        let mut h = header(
            tar::EntryType::Directory,
            if d == "tmp/" { 0o1777 } else { 0o755 },
            0,
            0,
        );
        b.append_data(&mut h, d, &[][..]).map_err(e("dir"))?;
    }
    let mut h = header(tar::EntryType::Directory, 0o755, 1000, 0);
    b.append_data(&mut h, "home/user/", &[][..])
        .map_err(e("dir"))?;
    for (l, t) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("usr/bin/sh", "dash"),
    ] {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0, 0);
        b.append_link(&mut h, l, t).map_err(e("symlink"))?;
    }
    let mut progs: Vec<PathBuf> = PROGRAMS.iter().map(PathBuf::from).collect();
    let mut seen = BTreeSet::new();
    for p in &progs {
        let data = std::fs::read(p).map_err(e("read program"))?;
        let name = usr_path(p);
        seen.insert(name.clone());
        let mut h = header(tar::EntryType::Regular, 0o755, 0, data.len() as u64);
        b.append_data(&mut h, &name, &data[..]).map_err(e("file"))?;
    }
    progs.extend(extra.iter().cloned());
    progs.extend(on_top.iter().cloned());
    for l in libraries(&progs)? {
        let name = usr_path(&l);
        if !seen.insert(name.clone()) {
            continue;
        }
        let md = std::fs::symlink_metadata(&l).map_err(e("stat library"))?;
        if md.file_type().is_symlink() {
            let t = std::fs::read_link(&l).map_err(e("readlink"))?;
            let mut h = header(tar::EntryType::Symlink, 0o777, 0, 0);
            b.append_link(&mut h, &name, &t).map_err(e("symlink"))?;
        } else {
            let data = std::fs::read(&l).map_err(e("read library"))?;
            let mut h = header(tar::EntryType::Regular, 0o755, 0, data.len() as u64);
            b.append_data(&mut h, &name, &data[..]).map_err(e("file"))?;
        }
    }
    for (n, body) in [
        (
            "etc/passwd",
            &b"root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"[..],
        ),
        ("etc/group", &b"root:x:0:\nuser:x:1000:\n"[..]),
    ] {
        let mut h = header(tar::EntryType::Regular, 0o644, 0, body.len() as u64);
        b.append_data(&mut h, n, body).map_err(e("file"))?;
    }
    let mut layers = vec![b.into_inner().map_err(e("tar"))?];
    if !on_top.is_empty() {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut t = tar::Builder::new(gz);
        for p in on_top {
            let data = std::fs::read(p).map_err(e("read program"))?;
            let mut h = header(tar::EntryType::Regular, 0o755, 0, data.len() as u64);
            t.append_data(&mut h, usr_path(p), &data[..])
                .map_err(e("file"))?;
        }
        let gz = t.into_inner().map_err(e("tar"))?;
        layers.push(gz.finish().map_err(e("gzip"))?);
    }
    write_layout(
        dir,
        &layers,
        &serde_json::json!({"Env": ["PATH=/usr/bin:/bin"], "User": "root", "WorkingDir": "/"}),
    )
}

/// Writes an OCI image layout with these layer tars (bottom first, gzip or plain) and this
/// image config (`Env`, `User`, ...).
pub fn write_layout(
    dir: &Path,
    layers: &[Vec<u8>],
    config: &serde_json::Value,
) -> Result<(), ImageError> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(io("mkdir blobs"))?;
    let put = |b: &[u8]| -> Result<(String, usize), ImageError> {
        let h = crate::digest::hex(&Sha256::digest(b));
        std::fs::write(blobs.join(&h), b).map_err(io("write blob"))?;
        Ok((format!("sha256:{h}"), b.len()))
    };
    let mut descs = Vec::new();
    for l in layers {
        let (d, n) = put(l)?;
        let mt = if l.starts_with(&[0x1f, 0x8b]) {
            "application/vnd.oci.image.layer.v1.tar+gzip"
        } else {
            "application/vnd.oci.image.layer.v1.tar"
        };
        descs.push(serde_json::json!({"mediaType": mt, "digest": d, "size": n}));
    }
    let cfg = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": []}
    }))
    .unwrap_or_default();
    let (cd, cn) = put(&cfg)?;
    let man = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cn},
        "layers": descs,
    }))
    .unwrap_or_default();
    let (md, mn) = put(&man)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
        .map_err(io("write oci-layout"))?;
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": mn}]}))
        .unwrap_or_default(),
    )
    .map_err(io("write index.json"))
}
