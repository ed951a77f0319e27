//! The FUSE filesystem: a pass-through to a backing directory that records
//! every unsynced data change in [`Pending`], so a "power cut" can take
//! them away. Single-threaded (fuser runs one request at a time), no
//! kernel caching (zero TTLs, direct I/O), so after a cut the peer reads
//! exactly what the backing files hold.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use fuser::consts::FOPEN_DIRECT_IO;
use fuser::{
    FileAttr, FileType, Filesystem, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};

use super::pending::Pending;

const TTL: Duration = Duration::ZERO;
const ROOT: u64 = 1;

/// What the filesystem and the cut share.
#[derive(Default)]
pub(crate) struct Shared {
    pub pending: Pending,
    /// Inode to path under the backing root.
    pub paths: HashMap<u64, PathBuf>,
    by_path: HashMap<PathBuf, u64>,
    next_ino: u64,
    files: HashMap<u64, (u64, File)>,
    next_fh: u64,
}

impl Shared {
    pub fn new(backing: &Path) -> Self {
        let mut shared = Shared {
            next_ino: ROOT + 1,
            next_fh: 1,
            ..Default::default()
        };
        shared.paths.insert(ROOT, backing.to_owned());
        shared.by_path.insert(backing.to_owned(), ROOT);
        shared
    }

    fn ino_for(&mut self, path: &Path) -> u64 {
        if let Some(ino) = self.by_path.get(path) {
            return *ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.paths.insert(ino, path.to_owned());
        self.by_path.insert(path.to_owned(), ino);
        ino
    }

    fn path(&self, ino: u64) -> Option<PathBuf> {
        self.paths.get(&ino).cloned()
    }

    fn child(&self, parent: u64, name: &OsStr) -> Option<PathBuf> {
        Some(self.paths.get(&parent)?.join(name))
    }

    fn forget_path(&mut self, path: &Path) {
        if let Some(ino) = self.by_path.remove(path) {
            self.paths.remove(&ino);
            self.pending.forget(ino);
        }
    }

    /// A rename moves the inode, and everything under it when it is a
    /// directory.
    fn moved(&mut self, from: &Path, to: &Path) {
        self.forget_path(to);
        let moved: Vec<(PathBuf, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (old, ino) in moved {
            let rest = old.strip_prefix(from).unwrap_or(Path::new(""));
            // `join("")` would add a trailing slash to a file's path.
            let new = if rest.as_os_str().is_empty() {
                to.to_owned()
            } else {
                to.join(rest)
            };
            self.by_path.remove(&old);
            self.by_path.insert(new.clone(), ino);
            self.paths.insert(ino, new);
        }
    }
}

pub(crate) struct LazyFs {
    pub shared: Arc<Mutex<Shared>>,
}

fn errno(error: &std::io::Error) -> i32 {
    error.raw_os_error().unwrap_or(libc::EIO)
}

fn attr(ino: u64, meta: &std::fs::Metadata) -> FileAttr {
    let time = |secs: i64, nanos: i64| {
        UNIX_EPOCH + Duration::new(secs.max(0) as u64, nanos.clamp(0, 999_999_999) as u32)
    };
    FileAttr {
        ino,
        size: meta.len(),
        blocks: meta.blocks(),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: if meta.is_dir() {
            FileType::Directory
        } else if meta.file_type().is_symlink() {
            FileType::Symlink
        } else {
            FileType::RegularFile
        },
        perm: (meta.permissions().mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl LazyFs {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry_for(&self, path: &Path, reply: ReplyEntry) {
        match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                let ino = self.lock().ino_for(path);
                reply.entry(&TTL, &attr(ino, &meta), 0);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open_file(&self, ino: u64, path: &Path, flags: i32) -> Result<u64, i32> {
        let access = flags & libc::O_ACCMODE;
        let file = std::fs::OpenOptions::new()
            .read(access != libc::O_WRONLY)
            .write(access != libc::O_RDONLY)
            .open(path)
            .map_err(|e| errno(&e))?;
        let mut shared = self.lock();
        if flags & libc::O_TRUNC != 0 {
            let _ = shared.pending.before_truncate(ino, &file, 0);
            file.set_len(0).map_err(|e| errno(&e))?;
        }
        let fh = shared.next_fh;
        shared.next_fh += 1;
        shared.files.insert(fh, (ino, file));
        Ok(fh)
    }
}

impl Filesystem for LazyFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let Some(path) = self.lock().child(parent, name) else {
            return reply.error(libc::ENOENT);
        };
        self.entry_for(&path, reply);
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyAttr) {
        let Some(path) = self.lock().path(ino) else {
            return reply.error(libc::ENOENT);
        };
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => reply.attr(&TTL, &attr(ino, &meta)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let Some(path) = self.lock().path(ino) else {
            return reply.error(libc::ENOENT);
        };
        if let Some(mode) = mode
            && let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        {
            return reply.error(errno(&e));
        }
        if let Some(size) = size {
            let result = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .and_then(|file| {
                    self.lock().pending.before_truncate(ino, &file, size)?;
                    file.set_len(size)
                });
            if let Err(e) = result {
                return reply.error(errno(&e));
            }
        }
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => reply.attr(&TTL, &attr(ino, &meta)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let Some(path) = self.lock().child(parent, name) else {
            return reply.error(libc::ENOENT);
        };
        match std::fs::create_dir(&path) {
            Ok(()) => {
                let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode));
                self.entry_for(&path, reply);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let Some(path) = self.lock().child(parent, name) else {
            return reply.error(libc::ENOENT);
        };
        match std::fs::remove_file(&path) {
            Ok(()) => {
                self.lock().forget_path(&path);
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let Some(path) = self.lock().child(parent, name) else {
            return reply.error(libc::ENOENT);
        };
        match std::fs::remove_dir(&path) {
            Ok(()) => {
                self.lock().forget_path(&path);
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        _flags: u32,
        reply: ReplyEmpty,
    ) {
        let (from, to) = {
            let shared = self.lock();
            match (shared.child(parent, name), shared.child(newparent, newname)) {
                (Some(from), Some(to)) => (from, to),
                _ => return reply.error(libc::ENOENT),
            }
        };
        match std::fs::rename(&from, &to) {
            Ok(()) => {
                self.lock().moved(&from, &to);
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let (from, to) = {
            let shared = self.lock();
            match (shared.path(ino), shared.child(newparent, newname)) {
                (Some(from), Some(to)) => (from, to),
                _ => return reply.error(libc::ENOENT),
            }
        };
        // A second name for the same data: give it its own inode here (the
        // undo log stays with the first name; RocksDB does not link files
        // it writes to, and the agent's `.prev` copies are not on this fs).
        match std::fs::hard_link(&from, &to) {
            Ok(()) => self.entry_for(&to, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let Some(path) = self.lock().path(ino) else {
            return reply.error(libc::ENOENT);
        };
        match self.open_file(ino, &path, flags) {
            Ok(fh) => reply.opened(fh, FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let Some(path) = self.lock().child(parent, name) else {
            return reply.error(libc::ENOENT);
        };
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .and_then(|_| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)));
        if let Err(e) = created {
            return reply.error(errno(&e));
        }
        let ino = self.lock().ino_for(&path);
        let fh = match self.open_file(ino, &path, flags) {
            Ok(fh) => fh,
            Err(e) => return reply.error(e),
        };
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => reply.created(&TTL, &attr(ino, &meta), 0, fh, FOPEN_DIRECT_IO),
            Err(e) => reply.error(errno(&e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let shared = self.lock();
        let Some((_, file)) = shared.files.get(&fh) else {
            return reply.error(libc::EBADF);
        };
        let mut buffer = vec![0; size as usize];
        let mut filled = 0;
        while filled < buffer.len() {
            match file.read_at(&mut buffer[filled..], offset as u64 + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => return reply.error(errno(&e)),
            }
        }
        reply.data(&buffer[..filled]);
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let mut shared = self.lock();
        let shared = &mut *shared;
        let Some((ino, file)) = shared.files.get(&fh) else {
            return reply.error(libc::EBADF);
        };
        match super::pending::write_at(&mut shared.pending, *ino, file, offset as u64, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock: u64, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().files.remove(&fh);
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _data: bool, reply: ReplyEmpty) {
        // The backing filesystem is not asked to sync: the machine does not
        // really lose power, only this filesystem's memory of the writes.
        self.lock().pending.synced(ino);
        reply.ok();
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _d: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let Some(path) = self.lock().path(ino) else {
            return reply.error(libc::ENOENT);
        };
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) => return reply.error(errno(&e)),
        };
        let mut all = vec![
            (ino, FileType::Directory, ".".into()),
            (ino, FileType::Directory, "..".into()),
        ];
        for entry in entries.flatten() {
            let child = entry.path();
            let kind = match entry.file_type() {
                Ok(t) if t.is_dir() => FileType::Directory,
                _ => FileType::RegularFile,
            };
            let child_ino = self.lock().ino_for(&child);
            all.push((child_ino, kind, entry.file_name()));
        }
        for (i, (ino, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, (i + 1) as i64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Only space reservation without a size change is passed through
        // (RocksDB preallocates its WAL that way); anything else would
        // change data behind the undo log's back.
        if mode != libc::FALLOC_FL_KEEP_SIZE {
            return reply.error(libc::EOPNOTSUPP);
        }
        let shared = self.lock();
        let Some((_, file)) = shared.files.get(&fh) else {
            return reply.error(libc::EBADF);
        };
        use std::os::fd::AsRawFd;
        // SAFETY: fallocate(2) on a descriptor we own, with plain integers.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, length) };
        if rc == 0 {
            reply.ok();
        } else {
            reply.error(errno(&std::io::Error::last_os_error()));
        }
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let Some(root) = self.lock().path(ROOT) else {
            return reply.error(libc::ENOENT);
        };
        let Ok(c_path) = std::ffi::CString::new(root.as_os_str().as_encoded_bytes()) else {
            return reply.error(libc::EINVAL);
        };
        // SAFETY: statvfs(2) writes into the zeroed struct we pass.
        #[allow(unsafe_code)]
        let (rc, st) = unsafe {
            let mut st: libc::statvfs = std::mem::zeroed();
            (libc::statvfs(c_path.as_ptr(), &mut st), st)
        };
        if rc != 0 {
            return reply.error(errno(&std::io::Error::last_os_error()));
        }
        reply.statfs(
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            st.f_bsize as u32,
            st.f_namemax as u32,
            st.f_frsize as u32,
        );
    }
}
