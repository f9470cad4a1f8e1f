//! Templates: building the `base` template.
//!
//! The `base` template is a directory `rootfs/` with the FHS skeleton (usr-merged: `bin`,
//! `sbin`, `lib*` are symlinks into `usr/`), an empty `usr/` (the host's `/usr` is mounted
//! there, idmapped and copy-on-write, in each sandbox) and a generated `/etc` with a few
//! allowlisted files copied from the host's. Files are owned by host root, which the
//! sandbox's idmapped mount shows as its own root.

use crate::JailError;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Uid/gid of the unprivileged user inside sandboxes.
pub const USER_UID: u32 = 1000;
/// Name of that user.
pub const USER_NAME: &str = "user";

/// Host `/etc` entries copied into the template (never the whole of `/etc`).
pub const ETC_ALLOWLIST: &[&str] = &[
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "bash.bashrc",
    "profile.d",
    "skel",
    "inputrc",
    "localtime",
    "timezone",
    "mime.types",
    "python3",
    "pam.d",
    "security",
    "sudo.conf",
    "sudo_logsrvd.conf",
    "terminfo",
    "debian_version",
    "os-release",
    "lsb-release",
    "gitconfig",
    "host.conf",
    "protocols",
    "services",
    "networks",
    "ethertypes",
    "rpc",
    "mailcap",
    "magic",
    "magic.mime",
    "wgetrc",
    "vim",
    "gai.conf",
    "default",
    "environment",
    "X11",
    "fonts",
    "pip.conf",
    "xdg",
    "manpath.config",
    "shells",
    "adduser.conf",
    "deluser.conf",
    "logrotate.d",
    "apt",
    "dpkg",
    "perl",
    "libaudit.conf",
    "selinux",
    "subuid",
    "subgid",
];

fn io(step: String) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Sys { step, source }
}

fn write(p: &Path, s: &str, mode: u32) -> Result<(), JailError> {
    std::fs::write(p, s).map_err(io(format!("write {}", p.display())))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("chmod {}", p.display())))
}

fn mkdir(p: &Path, mode: u32) -> Result<(), JailError> {
    std::fs::create_dir_all(p).map_err(io(format!("mkdir {}", p.display())))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("chmod {}", p.display())))
}

/// Copies a file, directory tree or symlink, keeping modes; everything ends up owned by
/// root. Special files are skipped.
fn copy_tree(src: &Path, dst: &Path) -> Result<(), JailError> {
    let md = std::fs::symlink_metadata(src).map_err(io(format!("stat {}", src.display())))?;
    let ft = md.file_type();
    if ft.is_symlink() {
        let t = std::fs::read_link(src).map_err(io(format!("readlink {}", src.display())))?;
        std::os::unix::fs::symlink(t, dst).map_err(io(format!("symlink {}", dst.display())))?;
    } else if ft.is_dir() {
        std::fs::create_dir(dst).map_err(io(format!("mkdir {}", dst.display())))?;
        for e in std::fs::read_dir(src)
            .map_err(io(format!("read {}", src.display())))?
            .flatten()
        {
            copy_tree(&e.path(), &dst.join(e.file_name()))?;
        }
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(md.mode() & 0o7777))
            .map_err(io(format!("chmod {}", dst.display())))?;
    } else if ft.is_file() {
        std::fs::copy(src, dst).map_err(io(format!("copy {}", src.display())))?;
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(md.mode() & 0o7777))
            .map_err(io(format!("chmod {}", dst.display())))?;
    }
    // Group ownership that matters (e.g. shadow-readable files) is not kept: root only.
    Ok(())
}

/// The generated `/etc` files: (path relative to etc, contents, mode).
pub fn generated_etc(hostname: &str) -> Vec<(&'static str, String, u32)> {
    let u = USER_UID;
    let n = USER_NAME;
    vec![
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/bin/bash\n\
                 daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
                 bin:x:2:2:bin:/bin:/usr/sbin/nologin\n\
                 sys:x:3:3:sys:/dev:/usr/sbin/nologin\n\
                 _apt:x:42:65534::/nonexistent:/usr/sbin/nologin\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
                 {n}:x:{u}:{u}:{n}:/home/{n}:/bin/bash\n"
            ),
            0o644,
        ),
        (
            "group",
            format!(
                "root:x:0:\ndaemon:x:1:\nbin:x:2:\nsys:x:3:\nadm:x:4:{n}\ntty:x:5:\ndisk:x:6:\n\
                 staff:x:50:\nsudo:x:27:{n}\naudio:x:29:\nvideo:x:44:\nplugdev:x:46:\n\
                 users:x:100:{n}\nnogroup:x:65534:\n{n}:x:{u}:\n"
            ),
            0o644,
        ),
        (
            "shadow",
            format!(
                "root:*:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\nbin:*:19000:0:99999:7:::\n\
                 sys:*:19000:0:99999:7:::\n_apt:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n\
                 {n}:*:19000:0:99999:7:::\n"
            ),
            0o640,
        ),
        (
            "gshadow",
            format!(
                "root:*::\ndaemon:*::\nbin:*::\nsys:*::\nadm:*::{n}\ntty:*::\ndisk:*::\nstaff:*::\n\
                 sudo:*::{n}\naudio:*::\nvideo:*::\nplugdev:*::\nusers:*::{n}\nnogroup:*::\n{n}:!::\n"
            ),
            0o640,
        ),
        (
            "sudoers",
            format!(
                "Defaults\tenv_reset\nDefaults\tsecure_path=\"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"\n\
                 Defaults\t!fqdn\nroot\tALL=(ALL:ALL) ALL\n%sudo\tALL=(ALL:ALL) NOPASSWD: ALL\n\
                 {n}\tALL=(ALL:ALL) NOPASSWD: ALL\n@includedir /etc/sudoers.d\n"
            ),
            0o440,
        ),
        ("hostname", format!("{hostname}\n"), 0o644),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"),
            0o644,
        ),
        ("resolv.conf", "# no network yet\n".into(), 0o644),
        ("machine-id", "b08dfa6083e7567a1921a715000001fb\n".into(), 0o444),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\ngshadow: files\nhosts: files myhostname dns\n\
             networks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n"
                .into(),
            0o644,
        ),
        (
            "login.defs",
            "MAIL_DIR /var/mail\nUMASK 022\nHOME_MODE 0755\nPASS_MAX_DAYS 99999\nPASS_MIN_DAYS 0\n\
             UID_MIN 1000\nUID_MAX 60000\nGID_MIN 1000\nGID_MAX 60000\nSYS_UID_MIN 100\nSYS_UID_MAX 999\n\
             ENCRYPT_METHOD SHA512\nENV_SUPATH PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
             ENV_PATH PATH=/usr/local/bin:/usr/bin:/bin\n"
                .into(),
            0o644,
        ),
        (
            "profile",
            "# /etc/profile (rampart base template)\numask 022\n\
             if [ \"$(id -u)\" -eq 0 ]; then\n  PATH=\"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"\n\
             else\n  PATH=\"/usr/local/bin:/usr/bin:/bin\"\nfi\nexport PATH\n\
             if [ \"${PS1-}\" ] && [ \"${BASH-}\" ] && [ \"$BASH\" != /bin/sh ] && [ -f /etc/bash.bashrc ]; then\n  . /etc/bash.bashrc\nfi\n\
             if [ -d /etc/profile.d ]; then\n  for i in /etc/profile.d/*.sh; do\n    [ -r \"$i\" ] && . \"$i\"\n  done\n  unset i\nfi\n"
                .into(),
            0o644,
        ),
        ("environment", "PATH=\"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"\n".into(), 0o644),
        ("fstab", "# none\n".into(), 0o644),
        ("mtab", String::new(), 0o644),
    ]
}

/// Builds the `base` template into `dest` (made atomically: built in a temp dir, renamed).
pub fn build_base(dest: &Path) -> Result<(), JailError> {
    build_base_from(dest, Path::new("/etc"), Path::new("/"))
}

/// [`build_base`] with the host's `/etc` and `/` given (for tests).
pub fn build_base_from(dest: &Path, host_etc: &Path, host_root: &Path) -> Result<(), JailError> {
    let parent = dest
        .parent()
        .ok_or_else(|| JailError::Template(format!("{} has no parent", dest.display())))?;
    std::fs::create_dir_all(parent).map_err(io(format!("mkdir {}", parent.display())))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent.join(format!(".{name}.building.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let r = build_into(&tmp, host_etc, host_root).and_then(|()| {
        let _ = std::fs::remove_dir_all(dest);
        std::fs::rename(&tmp, dest).map_err(io(format!("rename to {}", dest.display())))
    });
    if r.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    r
}

fn build_into(t: &Path, host_etc: &Path, host_root: &Path) -> Result<(), JailError> {
    let root: PathBuf = t.join("rootfs");
    mkdir(t, 0o755)?;
    mkdir(&root, 0o755)?;
    for (d, mode) in [
        ("usr", 0o755),
        ("proc", 0o555),
        ("dev", 0o755),
        ("sys", 0o555),
        ("tmp", 0o1777),
        ("run", 0o755),
        ("run/lock", 0o1777),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("var/lib", 0o755),
        ("var/cache", 0o755),
        ("var/log", 0o755),
        ("var/mail", 0o2775),
        ("var/spool", 0o755),
        ("home", 0o755),
        ("root", 0o700),
        ("mnt", 0o755),
        ("opt", 0o755),
        ("srv", 0o755),
        ("media", 0o755),
        ("etc", 0o755),
        ("etc/sudoers.d", 0o750),
    ] {
        mkdir(&root.join(d), mode)?;
    }
    std::os::unix::fs::symlink("../run", root.join("var/run"))
        .map_err(io("symlink var/run".into()))?;
    std::os::unix::fs::symlink("../run/lock", root.join("var/lock"))
        .map_err(io("symlink var/lock".into()))?;
    for l in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        if host_root.join("usr").join(l).exists() {
            std::os::unix::fs::symlink(format!("usr/{l}"), root.join(l))
                .map_err(io(format!("symlink {l}")))?;
        }
    }
    let etc = root.join("etc");
    for name in ETC_ALLOWLIST {
        let src = host_etc.join(name);
        if std::fs::symlink_metadata(&src).is_ok() {
            copy_tree(&src, &etc.join(name))?;
        }
    }
    for (name, body, mode) in generated_etc("sandbox") {
        let p = etc.join(name);
        let _ = std::fs::remove_file(&p);
        write(&p, &body, mode)?;
    }
    // The user's home, owned by the user (uid 1000 inside is uid_base+1000 through the idmap).
    let home = root.join("home").join(USER_NAME);
    mkdir(&home, 0o750)?;
    let skel = host_etc.join("skel");
    if let Ok(rd) = std::fs::read_dir(&skel) {
        for e in rd.flatten() {
            copy_tree(&e.path(), &home.join(e.file_name()))?;
        }
    }
    chown_tree(&home, USER_UID, USER_UID)?;
    for f in ["root/.bashrc", "root/.profile"] {
        let src = skel.join(Path::new(f).file_name().unwrap_or_default());
        if src.is_file() {
            copy_tree(&src, &root.join(f))?;
        }
    }
    Ok(())
}

fn chown_tree(p: &Path, uid: u32, gid: u32) -> Result<(), JailError> {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid))
        .map_err(io(format!("chown {}", p.display())))?;
    if std::fs::symlink_metadata(p)
        .map(|m| m.is_dir())
        .unwrap_or(false)
    {
        for e in std::fs::read_dir(p)
            .map_err(io(format!("read {}", p.display())))?
            .flatten()
        {
            chown_tree(&e.path(), uid, gid)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_users_are_consistent() {
        let etc = generated_etc("h");
        let get = |n: &str| {
            etc.iter()
                .find(|(k, _, _)| *k == n)
                .map(|(_, v, _)| v.clone())
                .unwrap()
        };
        assert!(get("passwd").contains("user:x:1000:1000:user:/home/user:/bin/bash"));
        assert!(get("group").contains("sudo:x:27:user"));
        assert!(get("sudoers").contains("user\tALL=(ALL:ALL) NOPASSWD: ALL"));
        assert!(get("login.defs").contains("UMASK 022"));
        assert!(get("shadow")
            .lines()
            .all(|l| l.split(':').nth(1) == Some("*")));
    }

    #[test]
    fn builds_a_template_atomically() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (chown)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("base");
        build_base(&dest).unwrap();
        let r = dest.join("rootfs");
        assert!(r.join("usr").is_dir());
        assert_eq!(
            std::fs::read_link(r.join("bin")).unwrap(),
            Path::new("usr/bin")
        );
        assert_eq!(
            std::fs::metadata(r.join("tmp")).unwrap().mode() & 0o7777,
            0o1777
        );
        assert_eq!(std::fs::metadata(r.join("home/user")).unwrap().uid(), 1000);
        assert_eq!(
            std::fs::metadata(r.join("etc/sudoers")).unwrap().mode() & 0o777,
            0o440
        );
        assert!(
            !r.join("etc/ssh").exists(),
            "only allowlisted host files are copied"
        );
        // Rebuilding replaces it.
        build_base(&dest).unwrap();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
