//! `filesystem.Filesystem` unary calls and entry descriptions.

use super::creds::{self, Creds};
use super::users::{self, Names, User};
use super::{Ctx, State};
use crate::connect::{Code, RpcError};
use crate::proto::{
    rfc3339, Empty, EntryInfo, EntryResponse, FileType, ListDirRequest, ListDirResponse,
    MoveRequest, PathRequest,
};
use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The Connect code of an I/O error (user errors never become `internal`).
pub fn code_of(e: &std::io::Error) -> Code {
    match e.raw_os_error() {
        Some(libc::ENOENT) => Code::NotFound,
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => Code::PermissionDenied,
        Some(libc::EEXIST) | Some(libc::ENOTEMPTY) => Code::AlreadyExists,
        Some(libc::ENOTDIR)
        | Some(libc::EISDIR)
        | Some(libc::EINVAL)
        | Some(libc::ENAMETOOLONG)
        | Some(libc::ELOOP)
        | Some(libc::EXDEV)
        | Some(libc::EMLINK)
        | Some(libc::EFBIG) => Code::InvalidArgument,
        Some(libc::EBUSY) | Some(libc::ETXTBSY) | Some(libc::EOPNOTSUPP) => {
            Code::FailedPrecondition
        }
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Code::ResourceExhausted,
        Some(_) => Code::Internal,
        None => match e.kind() {
            ErrorKind::NotFound => Code::NotFound,
            ErrorKind::PermissionDenied => Code::PermissionDenied,
            ErrorKind::AlreadyExists => Code::AlreadyExists,
            ErrorKind::NotADirectory
            | ErrorKind::IsADirectory
            | ErrorKind::InvalidInput
            | ErrorKind::InvalidData
            | ErrorKind::InvalidFilename => Code::InvalidArgument,
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded => Code::ResourceExhausted,
            _ => Code::Internal,
        },
    }
}

/// Map an I/O error on `path` to a Connect error.
pub fn io_err(e: &std::io::Error, what: &str, path: &Path) -> RpcError {
    let code = code_of(e);
    let msg = match code {
        Code::NotFound => format!(
            "file not found: {what} {}: no such file or directory",
            path.display()
        ),
        Code::ResourceExhausted => {
            format!("{what} {}: not enough disk space ({e})", path.display())
        }
        _ => format!("{what} {}: {e}", path.display()),
    };
    RpcError::new(code, msg)
}

/// Go's `FileMode.String()` from a raw `st_mode`.
pub fn go_mode_string(mode: u32) -> String {
    let fmt = mode & libc::S_IFMT;
    let mut s = String::with_capacity(11);
    match fmt {
        libc::S_IFDIR => s.push('d'),
        libc::S_IFLNK => s.push('L'),
        libc::S_IFIFO => s.push('p'),
        libc::S_IFSOCK => s.push('S'),
        libc::S_IFBLK => s.push('D'),
        libc::S_IFCHR => s.push_str("Dc"),
        _ => {}
    }
    if mode & libc::S_ISUID != 0 {
        s.push('u');
    }
    if mode & libc::S_ISGID != 0 {
        s.push('g');
    }
    if mode & libc::S_ISVTX != 0 {
        s.push('t');
    }
    if s.is_empty() {
        s.push('-');
    }
    const RWX: &[u8; 9] = b"rwxrwxrwx";
    for (i, c) in RWX.iter().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 {
            *c as char
        } else {
            '-'
        });
    }
    s
}

/// The `user.e2b.*` xattrs of a path, prefix stripped.
pub fn read_metadata(path: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return out;
    };
    let mut names = vec![0u8; 4096];
    // SAFETY: the buffer pointer and length describe a live, writable allocation.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return out;
    }
    names.truncate(n as usize);
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Some(key) = name.strip_prefix(b"user.e2b.") else {
            continue;
        };
        let Ok(cname) = std::ffi::CString::new(name) else {
            continue;
        };
        let mut val = vec![0u8; 65536];
        // SAFETY: valid C strings and a live, writable buffer of the given length.
        let m = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cname.as_ptr(),
                val.as_mut_ptr().cast(),
                val.len(),
            )
        };
        if m < 0 {
            continue;
        }
        val.truncate(m as usize);
        out.insert(
            String::from_utf8_lossy(key).into_owned(),
            String::from_utf8_lossy(&val).into_owned(),
        );
    }
    out
}

/// Removes every `user.e2b.*` xattr of a path (a file written anew has only the metadata
/// of that write, as with E2B's envd).
pub fn clear_metadata(path: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    let mut names = vec![0u8; 65536];
    // SAFETY: the buffer pointer and length describe a live, writable allocation.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        // A file system without xattrs has no metadata to clear.
        return match e.raw_os_error() {
            Some(libc::ENOTSUP) => Ok(()),
            _ => Err(e),
        };
    }
    names.truncate(n as usize);
    for name in names
        .split(|b| *b == 0)
        .filter(|n| n.starts_with(b"user.e2b."))
    {
        let cname = std::ffi::CString::new(name)?;
        // SAFETY: valid C strings.
        let r = unsafe { libc::lremovexattr(c.as_ptr(), cname.as_ptr()) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENODATA) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Set `user.e2b.<key>` on a path.
pub fn write_metadata(path: &Path, key: &str, value: &str) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    let name = std::ffi::CString::new(format!("user.e2b.{key}"))?;
    // SAFETY: valid C strings and a value buffer of the given length.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn file_type_of(m: &std::fs::Metadata) -> FileType {
    if m.is_file() {
        FileType::File
    } else if m.is_dir() {
        FileType::Directory
    } else {
        FileType::Unspecified
    }
}

/// Describe `path` (not following a final symlink) like envd.
pub fn entry_info(path: &Path, names: &Names) -> std::io::Result<EntryInfo> {
    let lm = std::fs::symlink_metadata(path)?;
    let mut e = EntryInfo {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into()),
        path: path.to_string_lossy().into_owned(),
        size: lm.size() as i64,
        permissions: go_mode_string(lm.mode()),
        owner: names.user(lm.uid()),
        group: names.group(lm.gid()),
        modified_time: Some(rfc3339(
            lm.mtime(),
            u32::try_from(lm.mtime_nsec()).unwrap_or(0),
        )),
        metadata: read_metadata(path),
        ..Default::default()
    };
    if lm.file_type().is_symlink() {
        e.is_symlink = true;
        match std::fs::canonicalize(path) {
            Ok(target) => {
                e.symlink_target = Some(target.to_string_lossy().into_owned());
                if let Ok(tm) = std::fs::metadata(&target) {
                    e.file_type = file_type_of(&tm);
                    e.mode = tm.permissions().mode() & 0o777;
                }
            }
            Err(_) => {
                // Dangling: the target as written, made absolute.
                let t = std::fs::read_link(path).unwrap_or_default();
                let abs = if t.is_absolute() {
                    t
                } else {
                    path.parent().unwrap_or(Path::new("/")).join(t)
                };
                e.symlink_target = Some(abs.to_string_lossy().into_owned());
            }
        }
    } else {
        e.file_type = file_type_of(&lm);
        e.mode = lm.permissions().mode() & 0o777;
    }
    Ok(e)
}

/// Change the owner of `path` to the user (only when the agent is root).
pub fn chown_to(path: &Path, user: &User) -> std::io::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid))
}

/// Create `dir` and missing parents, each new one 0755 and owned by the user.
pub fn make_dirs(dir: &Path, user: &User) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut cur = dir.to_path_buf();
    loop {
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => break,
            Ok(m)
                if m.file_type().is_symlink()
                    && std::fs::metadata(&cur).is_ok_and(|m| m.is_dir()) =>
            {
                break
            }
            Ok(_) => {
                return Err(std::io::Error::new(
                    ErrorKind::NotADirectory,
                    format!("{} exists and is not a directory", cur.display()),
                ))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                missing.push(cur.clone());
                if !cur.pop() {
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    for d in missing.iter().rev() {
        match std::fs::DirBuilder::new().mode(0o755).create(d) {
            Ok(()) => chown_to(d, user)?,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

use std::os::unix::fs::DirBuilderExt as _;

/// Resolve the request's user and a path for it.
pub fn user_path(state: &State, ctx: &Ctx, path: &str) -> Result<(User, PathBuf), RpcError> {
    let user = users::resolve(ctx.user.as_deref(), &state.config.default_user)?;
    let p = super::resolve_path(path, &user.home);
    Ok((user, p))
}

/// Run a filesystem operation with the user's permissions (see [`creds`](super::creds)).
pub async fn as_user<T, F>(user: &User, f: F) -> Result<T, RpcError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, RpcError> + Send + 'static,
{
    creds::run(Creds::of(user), f).await?
}

/// `Stat`.
pub async fn stat(
    state: &Arc<State>,
    ctx: &Ctx,
    req: PathRequest,
) -> Result<EntryResponse, RpcError> {
    let (user, p) = user_path(state, ctx, &req.path)?;
    let names = Names::load();
    as_user(&user, move || {
        let e = entry_info(&p, &names).map_err(|e| io_err(&e, "stat", &p))?;
        Ok(EntryResponse { entry: Some(e) })
    })
    .await
}

/// `MakeDir`.
pub async fn make_dir(
    state: &Arc<State>,
    ctx: &Ctx,
    req: PathRequest,
) -> Result<EntryResponse, RpcError> {
    let (user, p) = user_path(state, ctx, &req.path)?;
    let names = Names::load();
    let u = user.clone();
    as_user(&user, move || {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => {
                return Err(RpcError::new(
                    Code::AlreadyExists,
                    format!("directory already exists: {}", p.display()),
                ))
            }
            Ok(_) => {
                return Err(RpcError::new(
                    Code::AlreadyExists,
                    format!(
                        "path already exists and is not a directory: {}",
                        p.display()
                    ),
                ))
            }
            Err(_) => {}
        }
        make_dirs(&p, &u).map_err(|e| io_err(&e, "mkdir", &p))?;
        let e = entry_info(&p, &names).map_err(|e| io_err(&e, "stat", &p))?;
        Ok(EntryResponse { entry: Some(e) })
    })
    .await
}

/// `Move`.
pub async fn rename(
    state: &Arc<State>,
    ctx: &Ctx,
    req: MoveRequest,
) -> Result<EntryResponse, RpcError> {
    let (user, from) = user_path(state, ctx, &req.source)?;
    let to = super::resolve_path(&req.destination, &user.home);
    let names = Names::load();
    let u = user.clone();
    as_user(&user, move || {
        std::fs::symlink_metadata(&from).map_err(|e| io_err(&e, "move", &from))?;
        if let Some(parent) = to.parent() {
            make_dirs(parent, &u).map_err(|e| io_err(&e, "mkdir", parent))?;
        }
        match std::fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => move_across(&from, &to)?,
            Err(e) => return Err(io_err(&e, &format!("move {} to", from.display()), &to)),
        }
        let e = entry_info(&to, &names).map_err(|e| io_err(&e, "stat", &to))?;
        Ok(EntryResponse { entry: Some(e) })
    })
    .await
}

/// A move between two filesystems: copy (to a temporary name next to the destination, then
/// renamed over it) and remove the source. Files and symlinks only.
fn move_across(from: &Path, to: &Path) -> Result<(), RpcError> {
    let m = std::fs::symlink_metadata(from).map_err(|e| io_err(&e, "move", from))?;
    if m.is_dir() {
        return Err(RpcError::new(
            Code::InvalidArgument,
            format!(
                "cannot move directory {} to {}: they are on different filesystems",
                from.display(),
                to.display()
            ),
        ));
    }
    if std::fs::metadata(to).is_ok_and(|t| t.is_dir()) {
        return Err(RpcError::new(
            Code::InvalidArgument,
            format!(
                "cannot move {} over directory {}",
                from.display(),
                to.display()
            ),
        ));
    }
    let name = to
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = to.with_file_name(format!(".{name}.rampart-move-{}", std::process::id()));
    let copied = if m.file_type().is_symlink() {
        std::fs::read_link(from).and_then(|t| std::os::unix::fs::symlink(t, &tmp))
    } else {
        std::fs::copy(from, &tmp).map(|_| ())
    };
    let done = copied
        .and_then(|()| std::fs::rename(&tmp, to))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io_err(&e, &format!("move {} to", from.display()), to)
        });
    done?;
    std::fs::remove_file(from).map_err(|e| {
        io_err(
            &e,
            &format!("moved to {}, but removing the source", to.display()),
            from,
        )
    })
}

/// `Remove` (recursive; a missing path is fine).
pub async fn remove(state: &Arc<State>, ctx: &Ctx, req: PathRequest) -> Result<Empty, RpcError> {
    let (user, p) = user_path(state, ctx, &req.path)?;
    as_user(&user, move || {
        let r = match std::fs::symlink_metadata(&p) {
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p),
            Ok(_) => std::fs::remove_file(&p),
        };
        match r {
            Ok(()) => Ok(Empty {}),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Empty {}),
            Err(e) => Err(io_err(&e, "remove", &p)),
        }
    })
    .await
}

/// `ListDir`: lexical depth-first, entries up to `depth` levels below `path`.
pub async fn list_dir(
    state: &Arc<State>,
    ctx: &Ctx,
    req: ListDirRequest,
) -> Result<ListDirResponse, RpcError> {
    let (user, p) = user_path(state, ctx, &req.path)?;
    let depth = req.depth.max(1);
    let names = Names::load();
    as_user(&user, move || {
        let m = std::fs::metadata(&p).map_err(|e| io_err(&e, "list", &p))?;
        if !m.is_dir() {
            return Err(RpcError::new(
                Code::InvalidArgument,
                format!("path is not a directory: {}", p.display()),
            ));
        }
        // A symlinked directory is listed under the path that was asked for.
        let mut entries = Vec::new();
        walk(&p, 1, depth, &names, &mut entries).map_err(|e| io_err(&e, "list", &p))?;
        Ok(ListDirResponse { entries })
    })
    .await
}

fn walk(
    dir: &Path,
    level: u32,
    depth: u32,
    names: &Names,
    out: &mut Vec<EntryInfo>,
) -> std::io::Result<()> {
    let mut children: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    children.sort();
    for name in children {
        let path = dir.join(&name);
        let Ok(info) = entry_info(&path, names) else {
            continue;
        }; // vanished meanwhile
        let recurse = level < depth && !info.is_symlink && info.file_type == FileType::Directory;
        out.push(info);
        if recurse {
            // Unreadable subdirectories are listed but not entered.
            let _ = walk(&path, level + 1, depth, names, out);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_strings_like_go() {
        assert_eq!(go_mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(go_mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(go_mode_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(
            go_mode_string(libc::S_IFDIR | libc::S_ISVTX | 0o777),
            "dtrwxrwxrwx"
        );
        assert_eq!(
            go_mode_string(libc::S_IFREG | libc::S_ISUID | 0o755),
            "urwxr-xr-x"
        );
    }
}
