//! The agent's filesystem service and `/files`, driven through the client and raw HTTP.

mod common;

use bytes::Bytes;
use common::*;
use futures::StreamExt as _;
use rampart_agent::client::{ClientError, FileKind};
use std::io::Write as _;
use std::time::Duration;

fn pseudo_random(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn code_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> String {
    match r {
        Err(ClientError::Rpc { code, .. }) => code,
        other => panic!("expected an rpc error, got {other:?}"),
    }
}

#[tokio::test]
async fn write_and_read_large_binary_streamed() {
    let a = Agent::start().await;
    let dir = a.scratch();
    let data = pseudo_random(20 << 20);
    let chunks: Vec<Result<Bytes, std::io::Error>> = data
        .chunks(64 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let path = format!("{dir}/nested/deeper/file.bin");
    let written = a
        .client
        .write_file(&path, None, futures::stream::iter(chunks).boxed())
        .await
        .expect("write");
    assert_eq!(written, path);
    let mut s = a.client.read_file(&path, None).await.expect("read");
    let mut got = Vec::with_capacity(data.len());
    let mut pieces = 0;
    while let Some(c) = s.next().await {
        got.extend_from_slice(&c.expect("chunk"));
        pieces += 1;
    }
    assert!(pieces > 1, "download came in one piece");
    assert!(
        got == data,
        "roundtrip mismatch ({} vs {} bytes)",
        got.len(),
        data.len()
    );
    let st = a.client.stat(&path, None).await.expect("stat");
    assert_eq!(
        (st.kind, st.size, st.mode, st.permissions.as_str()),
        (FileKind::File, data.len() as u64, 0o644, "-rw-r--r--")
    );
    let d = a
        .client
        .stat(&format!("{dir}/nested"), None)
        .await
        .expect("stat dir");
    assert_eq!(
        (d.kind, d.mode, d.permissions.as_str()),
        (FileKind::Directory, 0o755, "drwxr-xr-x")
    );
    // Overwrite with something shorter.
    let w = a
        .client
        .write_file(
            &path,
            None,
            futures::stream::iter([Ok(Bytes::from_static(b"short"))]).boxed(),
        )
        .await;
    assert!(w.is_ok());
    let mut s = a.client.read_file(&path, None).await.expect("read");
    let mut got = Vec::new();
    while let Some(c) = s.next().await {
        got.extend_from_slice(&c.expect("chunk"));
    }
    assert_eq!(got, b"short");
}

#[tokio::test]
async fn download_errors_are_json() {
    let a = Agent::start().await;
    let dir = a.scratch();
    let r = raw(
        &a.sock(),
        "GET",
        &format!("/files?path={dir}/missing.txt"),
        &[],
        vec![],
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!(r#"{{"code":404,"message":"path '{dir}/missing.txt' does not exist"}}"#)
    );
    let r = raw(&a.sock(), "GET", &format!("/files?path={dir}"), &[], vec![]).await;
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).starts_with(r#"{"code":400,"#));
    let r = raw(
        &a.sock(),
        "GET",
        "/files?path=/etc/hostname&username=nobody-xyz",
        &[],
        vec![],
    )
    .await;
    assert_eq!(r.status, 401);
    match a
        .client
        .read_file(&format!("{dir}/missing.txt"), None)
        .await
    {
        Err(ClientError::Rpc { code, .. }) => assert_eq!(code, "not_found"),
        other => panic!("unexpected {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn multipart_upload_of_several_files_and_metadata() {
    let a = Agent::start().await;
    let dir = a.scratch();
    let boundary = "9db5b289b8cffb5a1911e78e0ef20be2";
    let mut body = Vec::new();
    for (name, content) in [
        (format!("{dir}/m/a.txt"), "hi"),
        (format!("{dir}/m/b.bin"), "second\r\n--not-a-boundary"),
    ] {
        write!(
            body,
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: text/plain\r\n\r\n{content}\r\n"
        )
        .expect("write");
    }
    write!(body, "--{boundary}--\r\n").expect("write");
    let ct = format!("multipart/form-data; boundary={boundary}");
    let r = raw(
        &a.sock(),
        "POST",
        "/files",
        &[("content-type", &ct), ("x-metadata-Owner", "me")],
        body,
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!(
            r#"[{{"name":"a.txt","type":"file","path":"{dir}/m/a.txt","metadata":{{"owner":"me"}}}},{{"name":"b.bin","type":"file","path":"{dir}/m/b.bin","metadata":{{"owner":"me"}}}}]"#
        )
    );
    assert_eq!(std::fs::read(format!("{dir}/m/a.txt")).expect("a"), b"hi");
    assert_eq!(
        std::fs::read(format!("{dir}/m/b.bin")).expect("b"),
        b"second\r\n--not-a-boundary"
    );
    // Metadata shows in Stat (if the filesystem keeps user xattrs).
    let r = unary(
        &a.sock(),
        "filesystem.Filesystem/Stat",
        &format!(r#"{{"path":"{dir}/m/a.txt"}}"#),
    )
    .await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(v["entry"]["metadata"]["owner"], "me", "{v}");
    assert_eq!(v["entry"]["size"], "2");
    assert_eq!(v["entry"]["type"], "FILE_TYPE_FILE");
    // Single file with ?path= (relative to home is resolved; here absolute).
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"ignored\"\r\n\r\nxyz\r\n--{boundary}--\r\n"
    );
    let r = raw(
        &a.sock(),
        "POST",
        &format!("/files?path={dir}/single.txt"),
        &[("content-type", &ct)],
        body.into_bytes(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        std::fs::read(format!("{dir}/single.txt")).expect("single"),
        b"xyz"
    );
    // Broken multipart.
    let r = raw(
        &a.sock(),
        "POST",
        "/files",
        &[("content-type", &ct)],
        b"garbage".to_vec(),
    )
    .await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn gzip_octet_stream_upload() {
    let a = Agent::start().await;
    let dir = a.scratch();
    let data = pseudo_random(300_000);
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&data).expect("gz");
    let gz = enc.finish().expect("gz");
    let r = raw(
        &a.sock(),
        "POST",
        &format!("/files?path={dir}/g.bin"),
        &[
            ("content-type", "application/octet-stream"),
            ("content-encoding", "gzip"),
        ],
        gz,
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(std::fs::read(format!("{dir}/g.bin")).expect("g") == data);
    let r = raw(
        &a.sock(),
        "POST",
        &format!("/files?path={dir}/bad.bin"),
        &[
            ("content-type", "application/octet-stream"),
            ("content-encoding", "gzip"),
        ],
        b"not gzip at all".to_vec(),
    )
    .await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let r = raw(
        &a.sock(),
        "POST",
        "/files",
        &[("content-type", "application/octet-stream")],
        b"x".to_vec(),
    )
    .await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn dirs_stat_symlink_list_move_remove() {
    let a = Agent::start().await;
    let dir = a.scratch();
    let c = &a.client;
    let e = c
        .make_dir(&format!("{dir}/a/b/c"), None)
        .await
        .expect("mkdir");
    assert_eq!((e.kind, e.name.as_str()), (FileKind::Directory, "c"));
    assert_eq!(
        code_of(c.make_dir(&format!("{dir}/a/b/c"), None).await),
        "already_exists"
    );
    std::fs::write(format!("{dir}/a/f1"), b"1").expect("w");
    std::fs::write(format!("{dir}/a/b/f2"), b"22").expect("w");
    std::fs::write(format!("{dir}/a/b/c/f3"), b"333").expect("w");
    std::os::unix::fs::symlink(format!("{dir}/a/b"), format!("{dir}/a/link")).expect("symlink");
    std::os::unix::fs::symlink("nowhere", format!("{dir}/a/dangling")).expect("symlink");

    let l = c
        .stat(&format!("{dir}/a/link"), None)
        .await
        .expect("stat link");
    assert_eq!(l.kind, FileKind::Directory);
    assert_eq!(
        l.symlink_target.as_deref(),
        Some(format!("{dir}/a/b").as_str())
    );
    assert!(l.permissions.starts_with('L'), "{}", l.permissions);
    let f = c.stat(&format!("{dir}/a/f1"), None).await.expect("stat");
    assert_eq!(
        (f.symlink_target, f.size, f.owner.as_str(), f.group.as_str()),
        (None, 1, "root", "root")
    );
    assert!(
        f.modified_time.ends_with('Z') && f.modified_time.contains('T'),
        "{}",
        f.modified_time
    );
    let d = c
        .stat(&format!("{dir}/a/dangling"), None)
        .await
        .expect("stat dangling");
    assert_eq!(d.kind, FileKind::Symlink);
    assert_eq!(
        code_of(c.stat(&format!("{dir}/nope"), None).await),
        "not_found"
    );

    let names = |v: Vec<rampart_agent::client::EntryInfo>| {
        v.into_iter().map(|e| e.path).collect::<Vec<_>>()
    };
    let l1 = names(
        c.list_dir(&format!("{dir}/a"), 1, None)
            .await
            .expect("list"),
    );
    assert_eq!(
        l1,
        ["b", "dangling", "f1", "link"].map(|n| format!("{dir}/a/{n}"))
    );
    let l2 = names(
        c.list_dir(&format!("{dir}/a"), 2, None)
            .await
            .expect("list"),
    );
    assert_eq!(
        l2,
        ["b", "b/c", "b/f2", "dangling", "f1", "link"].map(|n| format!("{dir}/a/{n}"))
    );
    let l3 = names(
        c.list_dir(&format!("{dir}/a"), 3, None)
            .await
            .expect("list"),
    );
    assert_eq!(
        l3,
        ["b", "b/c", "b/c/f3", "b/f2", "dangling", "f1", "link"].map(|n| format!("{dir}/a/{n}"))
    );
    assert_eq!(
        code_of(c.list_dir(&format!("{dir}/a/f1"), 1, None).await),
        "invalid_argument"
    );
    assert_eq!(
        code_of(c.list_dir(&format!("{dir}/zz"), 1, None).await),
        "not_found"
    );

    let m = c
        .rename(&format!("{dir}/a/f1"), &format!("{dir}/moved/f1"), None)
        .await
        .expect("move");
    assert_eq!(m.path, format!("{dir}/moved/f1"));
    assert!(!std::path::Path::new(&format!("{dir}/a/f1")).exists());
    assert_eq!(
        code_of(
            c.rename(&format!("{dir}/a/f1"), &format!("{dir}/x"), None)
                .await
        ),
        "not_found"
    );

    c.remove(&format!("{dir}/a"), None)
        .await
        .expect("remove tree");
    assert!(!std::path::Path::new(&format!("{dir}/a")).exists());
    c.remove(&format!("{dir}/a"), None)
        .await
        .expect("remove missing is fine");
    // Relative paths resolve against the user's home (root => /root): a stat of "." is /root.
    let h = c.stat(".", None).await.expect("home");
    assert_eq!(h.path, "/root");
}

async fn next_event(
    s: &mut futures::stream::BoxStream<
        'static,
        Result<rampart_agent::client::FsEvent, ClientError>,
    >,
) -> (String, String) {
    match tokio::time::timeout(Duration::from_secs(10), s.next()).await {
        Ok(Some(Ok(e))) => (e.name, e.kind),
        other => panic!("no event: {other:?}"),
    }
}

async fn expect_event(
    s: &mut futures::stream::BoxStream<
        'static,
        Result<rampart_agent::client::FsEvent, ClientError>,
    >,
    name: &str,
    kind: &str,
) {
    loop {
        let (n, k) = next_event(s).await;
        if n == name && k == kind {
            return;
        }
    }
}

#[tokio::test]
async fn watch_dir_recursive_events() {
    let a = Agent::start().await;
    let dir = a.scratch();
    let mut w = a.client.watch(&dir, true, None).await.expect("watch");
    // A file written through the agent: create, chmod (chown), write.
    a.client
        .write_file(
            &format!("{dir}/f.txt"),
            None,
            futures::stream::iter([Ok(Bytes::from_static(b"x"))]).boxed(),
        )
        .await
        .expect("write");
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(next_event(&mut w).await);
    }
    assert_eq!(
        seen,
        [("f.txt", "create"), ("f.txt", "chmod"), ("f.txt", "write")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    a.client
        .make_dir(&format!("{dir}/sub"), None)
        .await
        .expect("mkdir");
    expect_event(&mut w, "sub", "create").await;
    std::fs::write(format!("{dir}/sub/inner.txt"), b"1").expect("w");
    expect_event(&mut w, "sub/inner.txt", "create").await;
    expect_event(&mut w, "sub/inner.txt", "write").await;
    std::fs::rename(format!("{dir}/sub/inner.txt"), format!("{dir}/renamed.txt")).expect("mv");
    expect_event(&mut w, "sub/inner.txt", "rename").await;
    expect_event(&mut w, "renamed.txt", "create").await;
    std::fs::remove_file(format!("{dir}/f.txt")).expect("rm");
    expect_event(&mut w, "f.txt", "remove").await;

    assert_eq!(
        code_of(
            a.client
                .watch(&format!("{dir}/missing"), false, None)
                .await
                .map(|_| ())
        ),
        "not_found"
    );
    assert_eq!(
        code_of(
            a.client
                .watch(&format!("{dir}/renamed.txt"), false, None)
                .await
                .map(|_| ())
        ),
        "invalid_argument"
    );
}

#[tokio::test]
async fn polling_watcher() {
    let a = Agent::start().await;
    let dir = a.scratch();
    let sock = a.sock();
    let r = unary(
        &sock,
        "filesystem.Filesystem/CreateWatcher",
        &format!(r#"{{"path":"{dir}","recursive":true}}"#),
    )
    .await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    let id = v["watcherId"].as_str().expect("id").to_string();
    std::fs::write(format!("{dir}/p.txt"), b"1").expect("w");
    let mut events = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !events
        .iter()
        .any(|e: &serde_json::Value| e["type"] == "EVENT_TYPE_WRITE")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no events: {events:?}"
        );
        let r = unary(
            &sock,
            "filesystem.Filesystem/GetWatcherEvents",
            &format!(r#"{{"watcher_id":"{id}"}}"#),
        )
        .await;
        assert_eq!(r.status, 200);
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        if let Some(evs) = v["events"].as_array() {
            events.extend(evs.iter().cloned());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(events[0]["name"], "p.txt");
    assert_eq!(events[0]["type"], "EVENT_TYPE_CREATE");
    let r = unary(
        &sock,
        "filesystem.Filesystem/RemoveWatcher",
        &format!(r#"{{"watcherId":"{id}"}}"#),
    )
    .await;
    assert_eq!((r.status, &r.body[..]), (200, &b"{}"[..]));
    let r = unary(
        &sock,
        "filesystem.Filesystem/GetWatcherEvents",
        &format!(r#"{{"watcherId":"{id}"}}"#),
    )
    .await;
    assert_eq!(r.status, 404);
    assert!(String::from_utf8_lossy(&r.body).contains("not_found"));
}

#[tokio::test]
async fn files_as_another_user_are_owned_by_it() {
    let a = Agent::start().await;
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    if !passwd.lines().any(|l| l.starts_with("nobody:")) {
        eprintln!("skip: no 'nobody' user on this host");
        return;
    }
    // The file API acts with nobody's permissions: give it a world-writable place.
    let dir = a.scratch();
    let dir = open_to_everyone(&a, &dir);
    let path = format!("{dir}/owned/by/nobody.txt");
    let w = a
        .client
        .write_file(
            &path,
            Some("nobody"),
            futures::stream::iter([Ok(Bytes::from_static(b"n"))]).boxed(),
        )
        .await;
    assert!(w.is_ok(), "{w:?}");
    let st = a.client.stat(&path, None).await.expect("stat");
    assert_eq!(st.owner, "nobody");
    let d = a
        .client
        .stat(&format!("{dir}/owned"), None)
        .await
        .expect("stat");
    assert_eq!(d.owner, "nobody");
}

#[tokio::test]
async fn disk_full_is_507_resource_exhausted() {
    let a = Agent::start().await;
    let dir = a.scratch();
    let mnt = format!("{dir}/small");
    std::fs::create_dir_all(&mnt).expect("mkdir");
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs", &mnt])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skip: cannot mount a small tmpfs here");
        return;
    }
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let data = vec![7u8; 1 << 20];
    let r = raw(
        &a.sock(),
        "POST",
        &format!("/files?path={mnt}/big.bin"),
        &[("content-type", "application/octet-stream")],
        data.clone(),
    )
    .await;
    assert_eq!(r.status, 507, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).starts_with(r#"{"code":507,"#));
    let w = a
        .client
        .write_file(
            &format!("{mnt}/big2.bin"),
            None,
            futures::stream::iter([Ok(Bytes::from(data))]).boxed(),
        )
        .await;
    assert_eq!(code_of(w), "resource_exhausted");
}
