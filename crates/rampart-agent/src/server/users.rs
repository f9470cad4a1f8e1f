//! Users and groups of the sandbox, from its own `/etc/passwd` and `/etc/group`.

use crate::connect::{Code, RpcError};
use std::collections::HashMap;

/// A resolved user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Name.
    pub name: String,
    /// Uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// Home directory.
    pub home: String,
    /// Login shell.
    pub shell: String,
    /// Supplementary gids (primary included).
    pub groups: Vec<u32>,
}

/// A snapshot of the user and group databases.
#[derive(Debug, Default)]
pub struct UserDb {
    users: Vec<(String, u32, u32, String, String)>,
    groups: Vec<(String, u32, Vec<String>)>,
}

impl UserDb {
    /// Read `/etc/passwd` and `/etc/group` (missing files are empty databases).
    pub fn load() -> UserDb {
        Self::parse(
            &std::fs::read_to_string("/etc/passwd").unwrap_or_default(),
            &std::fs::read_to_string("/etc/group").unwrap_or_default(),
        )
    }

    /// The databases as [`UserDb::load`] reads them, re-read only when `/etc/passwd` or
    /// `/etc/group` changed (another inode, size, mtime or ctime) since the last call.
    pub fn cached() -> std::sync::Arc<UserDb> {
        type Cache = Option<([Option<Stamp>; 2], std::sync::Arc<UserDb>)>;
        static CACHE: std::sync::Mutex<Cache> = std::sync::Mutex::new(None);
        let now = [stamp("/etc/passwd"), stamp("/etc/group")];
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        match &*cache {
            Some((seen, db)) if *seen == now => db.clone(),
            _ => {
                let db = std::sync::Arc::new(Self::load());
                // A file that changes while being read shows a new stamp next time.
                *cache = Some((now, db.clone()));
                db
            }
        }
    }

    /// Parse the two files' contents.
    pub fn parse(passwd: &str, group: &str) -> UserDb {
        let mut db = UserDb::default();
        for line in passwd.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 7 || line.starts_with('#') {
                continue;
            }
            let (Ok(uid), Ok(gid)) = (f[2].parse(), f[3].parse()) else {
                continue;
            };
            db.users.push((
                f[0].to_string(),
                uid,
                gid,
                f[5].to_string(),
                f[6].to_string(),
            ));
        }
        for line in group.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 4 || line.starts_with('#') {
                continue;
            }
            let Ok(gid) = f[2].parse() else { continue };
            let members = f[3]
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            db.groups.push((f[0].to_string(), gid, members));
        }
        db
    }

    /// A user named by its number (OCI images' `User: "1000"`), or `root` missing from
    /// `/etc/passwd` (minimal images): the passwd entry of that uid if there is one, else a
    /// bare user (primary group = uid, home `/` or `/root`, shell `/bin/sh`).
    fn by_number(&self, name: &str) -> Option<User> {
        let uid: u32 = if name == "root" {
            0
        } else {
            name.parse().ok()?
        };
        if let Some(u) = self.users.iter().find(|u| u.1 == uid) {
            let n = u.0.clone();
            return self.user(&n);
        }
        Some(User {
            name: name.to_owned(),
            uid,
            gid: uid,
            home: if uid == 0 { "/root".into() } else { "/".into() },
            shell: "/bin/sh".into(),
            groups: vec![uid],
        })
    }

    /// Look a user up by name.
    pub fn user(&self, name: &str) -> Option<User> {
        let Some(entry) = self.users.iter().find(|u| u.0 == name) else {
            return self.by_number(name);
        };
        let (name, uid, gid, home, shell) = entry.clone();
        let mut groups = vec![gid];
        for (_, g, members) in &self.groups {
            if members.contains(&name) && !groups.contains(g) {
                groups.push(*g);
            }
        }
        Some(User {
            name,
            uid,
            gid,
            home,
            shell,
            groups,
        })
    }

    /// Uid -> name map (falls back to the number).
    pub fn uid_names(&self) -> HashMap<u32, String> {
        let mut m = HashMap::new();
        for u in &self.users {
            m.entry(u.1).or_insert_with(|| u.0.clone());
        }
        m
    }

    /// Gid -> name map.
    pub fn gid_names(&self) -> HashMap<u32, String> {
        let mut m = HashMap::new();
        for g in &self.groups {
            m.entry(g.1).or_insert_with(|| g.0.clone());
        }
        m
    }
}

/// What identifies one version of a file.
type Stamp = (u64, u64, u64, i64, i64, i64, i64);

fn stamp(path: &str) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}

/// Resolve a request's user name (`None` => the default user).
pub fn resolve(name: Option<&str>, default_user: &str) -> Result<User, RpcError> {
    let name = match name {
        Some(n) if !n.is_empty() => n,
        _ => default_user,
    };
    let user = UserDb::cached()
        .user(name)
        .ok_or_else(|| RpcError::new(Code::Unauthenticated, format!("invalid user: '{name}'")))?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 && user.uid != euid {
        return Err(RpcError::new(
            Code::PermissionDenied,
            format!("the agent does not run as root and cannot act as user '{name}'"),
        ));
    }
    Ok(user)
}

/// Names for uids and gids, loaded once per request.
#[derive(Debug)]
pub struct Names {
    uids: HashMap<u32, String>,
    gids: HashMap<u32, String>,
}

impl Names {
    /// Load from the databases.
    pub fn load() -> Names {
        let db = UserDb::load();
        Names {
            uids: db.uid_names(),
            gids: db.gid_names(),
        }
    }
    /// Owner name of a uid.
    pub fn user(&self, uid: u32) -> String {
        self.uids
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }
    /// Group name of a gid.
    pub fn group(&self, gid: u32) -> String {
        self.gids
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_databases() {
        let db = UserDb::parse(
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nbad line\n",
            "root:x:0:\nuser:x:1000:\nsudo:x:27:user,other\n",
        );
        let u = db.user("user").expect("user");
        assert_eq!((u.uid, u.gid, u.home.as_str()), (1000, 1000, "/home/user"));
        assert_eq!(u.groups, vec![1000, 27]);
        assert!(db.user("nobody").is_none());
        assert_eq!(db.gid_names().get(&27).map(String::as_str), Some("sudo"));
    }

    #[test]
    fn numeric_users_and_a_missing_root() {
        let db = UserDb::parse("user:x:1000:1000::/home/user:/bin/bash\n", "");
        assert_eq!(db.user("1000").expect("by uid").name, "user");
        let n = db.user("4242").expect("bare");
        assert_eq!((n.uid, n.gid, n.home.as_str()), (4242, 4242, "/"));
        let r = db.user("root").expect("root without passwd");
        assert_eq!((r.uid, r.home.as_str()), (0, "/root"));
        assert!(db.user("nobody").is_none());
    }
}
