//! The filesystem service acts with the requesting user's permissions, maps every errno to a
//! meaningful code, answers a full disk with 507 even mid-upload, follows dangling symlinks
//! like `open(O_CREAT)`, and reports files created in a brand-new watched subdirectory.

mod common;

use bytes::Bytes;
use common::*;
use futures::StreamExt as _;
use rampart_agent::client::ClientError;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::time::Duration;

fn rpc<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (String, String) {
    match r {
        Err(ClientError::Rpc { code, message }) => (code, message),
        other => panic!("expected an rpc error, got {other:?}"),
    }
}

fn one(b: &'static [u8]) -> futures::stream::BoxStream<'static, Result<Bytes, std::io::Error>> {
    futures::stream::iter([Ok(Bytes::from_static(b))]).boxed()
}

fn has_nobody() -> bool {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd.lines().any(|l| l.starts_with("nobody:"))
}

fn chmod(p: &str, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[tokio::test]
async fn every_operation_acts_with_the_users_permissions() {
    if !has_nobody() {
        eprintln!("skip: no 'nobody' user on this host");
        return;
    }
    let a = Agent::start().await;
    let c = &a.client;
    let dir = a.scratch();
    let public = open_to_everyone(&a, &dir);
    // Root-owned: a readable but not writable directory, a private directory, a secret file.
    let ro = format!("{dir}/ro");
    let private = format!("{dir}/private");
    std::fs::create_dir_all(&ro).expect("mkdir");
    std::fs::create_dir_all(format!("{private}/sub")).expect("mkdir");
    std::fs::write(format!("{ro}/secret"), b"s3cret").expect("write");
    std::fs::write(format!("{ro}/plain"), b"plain").expect("write");
    chmod(&ro, 0o755);
    chmod(&format!("{ro}/secret"), 0o600);
    chmod(&private, 0o700);
    let nobody = Some("nobody");
    let denied = |what: &str, r: (String, String)| {
        assert_eq!(r.0, "permission_denied", "{what}: {}", r.1);
    };

    // Download: 403, like `cat` would be refused; root still reads it.
    let r = raw(
        &a.sock(),
        "GET",
        &format!("/files?path={ro}/secret&username=nobody"),
        &[],
        vec![],
    )
    .await;
    assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).starts_with(r#"{"code":403,"#));
    if std::path::Path::new("/etc/shadow").exists() {
        denied(
            "shadow",
            rpc(c.read_file("/etc/shadow", nobody).await.map(|_| ())),
        );
        assert!(c.read_file("/etc/shadow", Some("root")).await.is_ok());
    }
    let mut s = c
        .read_file(&format!("{ro}/secret"), None)
        .await
        .expect("root reads");
    assert_eq!(s.next().await.expect("chunk").expect("data"), "s3cret");
    // What nobody may read it reads.
    let mut s = c
        .read_file(&format!("{ro}/plain"), nobody)
        .await
        .expect("nobody reads a 0644 file");
    assert_eq!(s.next().await.expect("chunk").expect("data"), "plain");

    // Stat, list and watch inside a directory nobody cannot enter.
    denied("stat", rpc(c.stat(&format!("{private}/sub"), nobody).await));
    denied("list", rpc(c.list_dir(&private, 1, nobody).await));
    denied(
        "watch",
        rpc(c.watch(&private, false, nobody).await.map(|_| ())),
    );
    assert!(c.list_dir(&private, 1, None).await.is_ok());

    // Writes into a directory nobody cannot write.
    denied(
        "upload",
        rpc(c.write_file(&format!("{ro}/new"), nobody, one(b"x")).await),
    );
    denied(
        "overwrite",
        rpc(c
            .write_file(&format!("{ro}/plain"), nobody, one(b"x"))
            .await),
    );
    denied(
        "mkdir",
        rpc(c.make_dir(&format!("{ro}/newdir"), nobody).await),
    );
    denied(
        "move",
        rpc(c
            .rename(&format!("{ro}/plain"), &format!("{public}/stolen"), nobody)
            .await),
    );
    denied(
        "remove",
        rpc(c.remove(&format!("{ro}/plain"), nobody).await),
    );
    assert_eq!(
        std::fs::read(format!("{ro}/plain")).expect("still there"),
        b"plain"
    );
    assert!(!std::path::Path::new(&format!("{ro}/new")).exists());
    // Multipart upload as nobody: 403 too.
    let boundary = "XbOuNdArYx";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{ro}/mp\"\r\n\r\nhi\r\n--{boundary}--\r\n"
    );
    let ct = format!("multipart/form-data; boundary={boundary}");
    let r = raw(
        &a.sock(),
        "POST",
        "/files?username=nobody",
        &[("content-type", ct.as_str())],
        body.into_bytes(),
    )
    .await;
    assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));

    // Where nobody may write, what it creates is its own.
    let w = c
        .write_file(&format!("{public}/a/b/mine.txt"), nobody, one(b"mine"))
        .await
        .expect("write as nobody");
    let m = std::fs::metadata(&w).expect("stat");
    let nobody_uid = m.uid();
    assert_ne!(nobody_uid, 0);
    assert_eq!(
        std::fs::metadata(format!("{public}/a"))
            .expect("stat")
            .uid(),
        nobody_uid
    );
    let d = c
        .make_dir(&format!("{public}/made"), nobody)
        .await
        .expect("mkdir as nobody");
    assert_eq!(d.owner, "nobody");
    c.rename(&w, &format!("{public}/moved.txt"), nobody)
        .await
        .expect("move as nobody");
    c.remove(&format!("{public}/a"), nobody)
        .await
        .expect("remove as nobody");
    // Root keeps full access.
    c.remove(&format!("{ro}/plain"), Some("root"))
        .await
        .expect("root removes");
}

#[tokio::test]
async fn user_errors_are_never_internal() {
    let a = Agent::start().await;
    let c = &a.client;
    let dir = a.scratch();
    std::fs::write(format!("{dir}/file"), b"f").expect("write");
    let code = |r: (String, String)| r.0;

    // ENOTDIR: a path through a regular file.
    assert_eq!(
        code(rpc(c.stat(&format!("{dir}/file/x"), None).await)),
        "invalid_argument"
    );
    assert_eq!(
        code(rpc(c
            .write_file(&format!("{dir}/file/x"), None, one(b"x"))
            .await)),
        "invalid_argument"
    );
    assert_eq!(
        code(rpc(c.make_dir(&format!("{dir}/file/x"), None).await)),
        "invalid_argument"
    );
    let r = raw(
        &a.sock(),
        "GET",
        &format!("/files?path={dir}/file/x"),
        &[],
        vec![],
    )
    .await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    // EISDIR: writing over a directory.
    let r = raw(
        &a.sock(),
        "POST",
        &format!("/files?path={dir}"),
        &[("content-type", "application/octet-stream")],
        b"x".to_vec(),
    )
    .await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    // ENAMETOOLONG.
    let long = "n".repeat(300);
    assert_eq!(
        code(rpc(c.stat(&format!("{dir}/{long}"), None).await)),
        "invalid_argument"
    );
    assert_eq!(
        code(rpc(c
            .write_file(&format!("{dir}/{long}"), None, one(b"x"))
            .await)),
        "invalid_argument"
    );
    // ELOOP: a symlink pointing at itself, used as a directory and written through.
    std::os::unix::fs::symlink(format!("{dir}/loop"), format!("{dir}/loop")).expect("ln");
    assert_eq!(
        code(rpc(c.stat(&format!("{dir}/loop/x"), None).await)),
        "invalid_argument"
    );
    let r = raw(
        &a.sock(),
        "POST",
        &format!("/files?path={dir}/loop"),
        &[("content-type", "application/octet-stream")],
        b"x".to_vec(),
    )
    .await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    // Moving a directory onto a non-empty one: already_exists; into itself: invalid_argument.
    std::fs::create_dir_all(format!("{dir}/d1")).expect("mkdir");
    std::fs::create_dir_all(format!("{dir}/d2/full")).expect("mkdir");
    assert_eq!(
        code(rpc(c
            .rename(&format!("{dir}/d1"), &format!("{dir}/d2"), None)
            .await)),
        "already_exists"
    );
    assert_eq!(
        code(rpc(c
            .rename(&format!("{dir}/d1"), &format!("{dir}/d1/inside"), None)
            .await)),
        "invalid_argument"
    );
}

#[tokio::test]
async fn uploads_through_dangling_symlinks() {
    let a = Agent::start().await;
    let c = &a.client;
    let dir = a.scratch();
    // The target's directory exists: the target is created, like open(O_CREAT) would.
    std::os::unix::fs::symlink(format!("{dir}/target.txt"), format!("{dir}/link")).expect("ln");
    c.write_file(&format!("{dir}/link"), None, one(b"through"))
        .await
        .expect("write through a dangling link");
    assert_eq!(
        std::fs::read(format!("{dir}/target.txt")).expect("target"),
        b"through"
    );
    assert!(std::fs::symlink_metadata(format!("{dir}/link"))
        .expect("link")
        .file_type()
        .is_symlink());
    // Relative target too.
    std::os::unix::fs::symlink("rel.txt", format!("{dir}/rlink")).expect("ln");
    c.write_file(&format!("{dir}/rlink"), None, one(b"r"))
        .await
        .expect("write through a relative link");
    assert_eq!(
        std::fs::read(format!("{dir}/rel.txt")).expect("target"),
        b"r"
    );
    // The target's directory does not exist: a clear 404, not a 500.
    std::os::unix::fs::symlink(format!("{dir}/nope/x.txt"), format!("{dir}/broken")).expect("ln");
    let r = raw(
        &a.sock(),
        "POST",
        &format!("/files?path={dir}/broken"),
        &[("content-type", "application/octet-stream")],
        b"x".to_vec(),
    )
    .await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert_eq!(r.status, 404, "{text}");
    assert!(text.contains("symbolic link"), "{text}");
    let (code, _) = rpc(c
        .write_file(&format!("{dir}/broken"), None, one(b"x"))
        .await);
    assert_eq!(code, "not_found");
    // Stat of the dangling link itself still works.
    let st = c.stat(&format!("{dir}/broken"), None).await.expect("stat");
    assert!(st.symlink_target.is_some());
}

/// A small tmpfs under `dir`, unmounted when dropped; `None` when mounting is not possible.
struct SmallFs(String);

impl SmallFs {
    fn mount(dir: &str, name: &str, size: &str) -> Option<SmallFs> {
        let mnt = format!("{dir}/{name}");
        std::fs::create_dir_all(&mnt).expect("mkdir");
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", &mnt])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skip: cannot mount a tmpfs here");
            return None;
        }
        Some(SmallFs(mnt))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test]
async fn a_full_disk_answers_507_while_the_client_is_still_sending() {
    let a = Agent::start().await;
    let dir = a.scratch();
    let Some(fs) = SmallFs::mount(&dir, "small", "1m") else {
        return;
    };
    // 256 MiB, produced lazily: far more than the socket buffers, so the agent answers long
    // before the client is done sending.
    let chunk = Bytes::from(vec![7u8; 256 * 1024]);
    let body = futures::stream::iter((0..1024).map(move |_| Ok(chunk.clone()))).boxed();
    let (code, message) = rpc(a
        .client
        .write_file(&format!("{}/big.bin", fs.0), None, body)
        .await);
    assert_eq!(code, "resource_exhausted", "{message}");
    assert!(message.contains("disk space"), "{message}");
    // The same for a user other than root.
    if has_nobody() {
        chmod(&fs.0, 0o1777);
        open_to_everyone(&a, &dir);
        let chunk = Bytes::from(vec![7u8; 256 * 1024]);
        let body = futures::stream::iter((0..1024).map(move |_| Ok(chunk.clone()))).boxed();
        let (code, message) = rpc(a
            .client
            .write_file(&format!("{}/big2.bin", fs.0), Some("nobody"), body)
            .await);
        assert_eq!(code, "resource_exhausted", "{message}");
    }
    // The agent is fine afterwards.
    a.client.health().await.expect("healthy");
}

#[tokio::test]
async fn a_move_across_filesystems_copies_files() {
    let a = Agent::start().await;
    let c = &a.client;
    let dir = a.scratch();
    let Some(fs) = SmallFs::mount(&dir, "other", "4m") else {
        return;
    };
    std::fs::write(format!("{dir}/f.txt"), b"moving").expect("write");
    chmod(&format!("{dir}/f.txt"), 0o640);
    let e = c
        .rename(
            &format!("{dir}/f.txt"),
            &format!("{}/sub/g.txt", fs.0),
            None,
        )
        .await
        .expect("move across filesystems");
    assert_eq!(e.path, format!("{}/sub/g.txt", fs.0));
    assert_eq!(e.mode, 0o640);
    assert_eq!(
        std::fs::read(format!("{}/sub/g.txt", fs.0)).expect("moved"),
        b"moving"
    );
    assert!(!std::path::Path::new(&format!("{dir}/f.txt")).exists());
    // A symlink moves as a symlink.
    std::os::unix::fs::symlink("/etc/hostname", format!("{dir}/ln")).expect("ln");
    c.rename(&format!("{dir}/ln"), &format!("{}/ln", fs.0), None)
        .await
        .expect("move a symlink");
    assert_eq!(
        std::fs::read_link(format!("{}/ln", fs.0)).expect("link"),
        std::path::Path::new("/etc/hostname")
    );
    // A directory does not: a clear invalid_argument, and nothing is lost.
    std::fs::create_dir_all(format!("{dir}/d")).expect("mkdir");
    let (code, message) = rpc(c
        .rename(&format!("{dir}/d"), &format!("{}/d", fs.0), None)
        .await);
    assert_eq!(code, "invalid_argument", "{message}");
    assert!(message.contains("different filesystems"), "{message}");
    assert!(std::path::Path::new(&format!("{dir}/d")).is_dir());
}

#[tokio::test]
async fn a_recursive_watch_sees_files_in_a_just_created_subdirectory() {
    let a = Agent::start().await;
    let dir = a.scratch();
    let mut w = a.client.watch(&dir, true, None).await.expect("watch");
    // mkdir and create inside at once, many times: the file must be reported every time,
    // whether it appeared before or after the new directory's watch, and only once.
    const ROUNDS: usize = 30;
    for i in 0..ROUNDS {
        std::fs::create_dir_all(format!("{dir}/d{i}/e")).expect("mkdir");
        std::fs::write(format!("{dir}/d{i}/e/f.txt"), b"x").expect("write");
    }
    let mut creates: Vec<String> = Vec::new();
    let want =
        |creates: &Vec<String>| (0..ROUNDS).all(|i| creates.contains(&format!("d{i}/e/f.txt")));
    while !want(&creates) {
        match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
            Ok(Some(Ok(e))) => {
                if e.kind == "create" {
                    creates.push(e.name);
                }
            }
            other => panic!("watch ended or stalled ({other:?}); creates so far: {creates:?}"),
        }
    }
    for i in 0..ROUNDS {
        for name in [format!("d{i}"), format!("d{i}/e"), format!("d{i}/e/f.txt")] {
            let n = creates.iter().filter(|c| **c == name).count();
            assert!(n <= 1, "{name} reported created {n} times: {creates:?}");
        }
        assert!(creates.contains(&format!("d{i}/e")), "{creates:?}");
    }
    // Later changes in the new directories are watched too.
    std::fs::write(format!("{dir}/d0/e/later.txt"), b"y").expect("write");
    loop {
        match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
            Ok(Some(Ok(e))) if e.name == "d0/e/later.txt" && e.kind == "create" => break,
            Ok(Some(Ok(_))) => {}
            other => panic!("no event for later.txt: {other:?}"),
        }
    }
}
