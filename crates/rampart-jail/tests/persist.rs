//! The jail's persistence helpers on real files (root: chown, xattrs, loop devices):
//! uid shift of a writable layer, machine id, volume images and their loop devices, clones.

use rampart_jail::{persist, store};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let r = unsafe { libc::geteuid() } == 0;
    if !r {
        eprintln!("skipped: not root");
    }
    r
}

fn chown(p: &Path, u: u32) {
    std::os::unix::fs::lchown(p, Some(u), Some(u)).unwrap();
}

#[test]
fn shift_moves_owners_into_the_new_range_and_keeps_setid_bits() {
    if !root() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (from, to) = (200_000u32, 400_000u32);
    let up = t.path().join("upper");
    std::fs::create_dir_all(up.join("home/user/deep/er")).unwrap();
    std::fs::write(up.join("home/user/f"), b"x").unwrap();
    std::fs::write(up.join("suid"), b"x").unwrap();
    std::os::unix::fs::symlink("/etc/shadow", up.join("home/user/link")).unwrap();
    std::fs::write(up.join("foreign"), b"x").unwrap();
    for p in [
        "",
        "home",
        "home/user",
        "home/user/deep",
        "home/user/deep/er",
        "suid",
    ] {
        chown(&up.join(p), from);
    }
    chown(&up.join("home/user/f"), from + 1000);
    chown(&up.join("home/user/link"), from + 1000);
    chown(&up.join("foreign"), 12345);
    std::fs::set_permissions(up.join("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::create_dir(t.path().join("usr-upper")).unwrap();
    chown(&t.path().join("usr-upper"), from);

    persist::shift_uids(t.path(), from, to).unwrap();

    let m = |p: &str| std::fs::symlink_metadata(up.join(p)).unwrap();
    assert_eq!(m("").uid(), to);
    assert_eq!(m("home/user/deep/er").uid(), to);
    assert_eq!(
        (m("home/user/f").uid(), m("home/user/f").gid()),
        (to + 1000, to + 1000)
    );
    assert_eq!(
        m("home/user/link").uid(),
        to + 1000,
        "the link itself, not its target"
    );
    assert_eq!(m("foreign").uid(), 12345, "ids outside the old range stay");
    assert_eq!(
        m("suid").mode() & 0o7777,
        0o4755,
        "set-id bits survive the chown"
    );
    assert_eq!(
        std::fs::metadata(t.path().join("usr-upper")).unwrap().uid(),
        to
    );
    // The host's /etc/shadow was not touched through the link.
    assert_eq!(std::fs::metadata("/etc/shadow").unwrap().uid(), 0);
}

#[test]
fn machine_id_is_fresh_and_never_follows_a_planted_link() {
    if !root() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("upper/etc")).unwrap();
    persist::write_machine_id(t.path(), 300_000).unwrap();
    let id1 = std::fs::read_to_string(t.path().join("upper/etc/machine-id")).unwrap();
    assert_eq!(id1.trim().len(), 32);
    let md = std::fs::metadata(t.path().join("upper/etc/machine-id")).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o777), (300_000, 0o444));
    persist::write_machine_id(t.path(), 300_000).unwrap();
    let id2 = std::fs::read_to_string(t.path().join("upper/etc/machine-id")).unwrap();
    assert_ne!(id1, id2);
    // upper/etc a symlink (a sandbox's choice): left alone, nothing written through it.
    let t2 = tempfile::tempdir().unwrap();
    let target = t2.path().join("target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::create_dir_all(t2.path().join("d/upper")).unwrap();
    std::os::unix::fs::symlink(&target, t2.path().join("d/upper/etc")).unwrap();
    persist::write_machine_id(&t2.path().join("d"), 300_000).unwrap();
    assert!(!target.join("machine-id").exists());
}

#[test]
fn volumes_are_made_whole_or_not_at_all_and_clones_never_overwrite() {
    if !root() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("volumes/v.img");
    persist::create_volume(&img, 32).unwrap();
    assert!(img.exists());
    assert!(!persist::volume_in_use(&img));
    // A second one under the same name is refused and the first is intact.
    assert!(persist::create_volume(&img, 32).is_err());
    let names: Vec<_> = std::fs::read_dir(t.path().join("volumes"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
    // Clones: a copy that does not change with the original.
    let c = t.path().join("clone.img");
    store::clone_file(&img, &c).unwrap();
    assert_eq!(
        std::fs::metadata(&c).unwrap().len(),
        std::fs::metadata(&img).unwrap().len()
    );
    assert!(
        store::clone_file(&img, &c).is_err(),
        "never over an existing file"
    );
}

#[test]
fn concurrent_makes_of_one_volume_give_one_sound_image() {
    if !root() {
        return;
    }
    if std::process::Command::new("e2fsck")
        .arg("-V")
        .output()
        .is_err()
    {
        eprintln!("skipped: no e2fsck");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("volumes/v.img");
    let made: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| persist::create_volume(&img, 64).is_ok()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(made.iter().filter(|m| **m).count(), 1, "{made:?}");
    let out = std::process::Command::new("e2fsck")
        .args(["-f", "-n"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the image is a sound ext4: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let names: Vec<_> = std::fs::read_dir(t.path().join("volumes"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
}
