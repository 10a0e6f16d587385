//! The local store's files and kernel locks. Every decision is made while
//! holding the `flock` of the prefix's `meta` file; a contender is live
//! while its `<ticket>.c` file is locked, which the kernel undoes when the
//! process dies.
//!
//! In a directory that every user shares (sticky, as /tmp), a file belongs
//! to the user who made it, and nobody else may remove, rename or rename
//! over it. So the files that every contender rewrites (`meta`, `state`)
//! are made writable by all and rewritten in place, and a contender's own
//! files are read by others (to probe its lock) but removed by their owner,
//! or by another user only where the kernel lets it (root): files that a
//! dead contender of another user left are skipped, never in the way.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{
    DirBuilderExt as _, FileExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::decide::{self, Found, Seen};
use super::record::{self, Read, State, FLOOR_LEN};
use crate::store::{ContenderInfo, StoreError};

/// The longest directory name a prefix may take, percent-encoded.
const MAX_NAME: usize = 200;

/// How often `lock_within` tries again while another process holds `meta`.
const LOCK_RETRY: Duration = Duration::from_millis(10);

/// The directory of one prefix.
pub struct PrefixDir {
    path: PathBuf,
    /// Other users may join: files are made readable (or writable) by all,
    /// and the directory writable by all and sticky.
    shared: bool,
}

/// Holds the `flock` of `meta` until dropped.
pub struct MetaLock(#[allow(dead_code)] File);

/// A contender's files, made and locked when it joins.
pub struct Joined {
    pub ticket: u64,
    /// Locked for the contender's life: others see it live while it is.
    pub contender: File,
    /// Locked while it waits: the waiter behind it blocks on it.
    pub queue: File,
    pub wake: WakeFifo,
}

/// A file of a contender that is gone, which the contenders skip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleFile {
    pub ticket: u64,
    pub path: PathBuf,
    pub owner: u32,
}

/// Which of a ticket's files are there, besides its wake FIFO.
#[derive(Debug, Clone, Copy, Default)]
struct Present {
    contender: bool,
    queue: bool,
}

/// What a contender file says besides its description (which
/// `ContenderInfo` reads and ignores this in).
#[derive(serde::Deserialize)]
struct JoinedWith {
    #[serde(rename = "Limit")]
    limit: Option<u32>,
}

pub fn io_error(what: &str, path: &Path, error: io::Error) -> StoreError {
    let message = format!("{what} {}: {error}", path.display());
    match error.kind() {
        io::ErrorKind::PermissionDenied => StoreError::denied(format!(
            "{message}; use a directory this user can write: --store local:DIR"
        )),
        _ => StoreError::unavailable(message),
    }
}

/// The user `uid`'s name, or `uid N` if it has none.
pub fn user_name(uid: u32) -> String {
    let mut buffer = vec![0 as libc::c_char; 4096];
    // SAFETY: getpwuid_r writes into the zeroed entry and the buffer, both
    // ours and of the sizes given; the name it points to lives in buffer.
    unsafe {
        let mut entry: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        if libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut result,
        ) == 0
            && !result.is_null()
        {
            return std::ffi::CStr::from_ptr(entry.pw_name)
                .to_string_lossy()
                .into_owned();
        }
    }
    format!("uid {uid}")
}

pub fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// True if this process may write `path`.
pub fn writable(path: &Path) -> bool {
    let Ok(path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: access reads the NUL-terminated path and has no other effect.
    unsafe { libc::access(path.as_ptr(), libc::W_OK) == 0 }
}

/// The prefix as one directory name: bytes other than letters, digits, `.`,
/// `_` and `-` are percent-encoded (so `/` too).
pub fn dir_name(prefix: &str) -> Result<String, StoreError> {
    let mut name = String::new();
    for byte in prefix.bytes() {
        if byte.is_ascii_alphanumeric() || b"._-".contains(&byte) {
            name.push(byte as char);
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    if name.len() > MAX_NAME {
        return Err(StoreError::usage(format!(
            "--prefix is too long for the local store ({} bytes once encoded as a file name, at most {MAX_NAME}): use a shorter one",
            name.len()
        )));
    }
    Ok(name)
}

/// The prefix a directory name of [`dir_name`] stands for; `None` for a
/// name it does not make.
pub fn prefix_of(name: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(name.len());
    let mut rest = name.bytes();
    while let Some(byte) = rest.next() {
        match byte {
            b'%' => {
                let hex = [rest.next()?, rest.next()?];
                bytes.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            byte if byte.is_ascii_alphanumeric() || b"._-".contains(&byte) => bytes.push(byte),
            _ => return None,
        }
    }
    let prefix = String::from_utf8(bytes).ok()?;
    // Only the one name `dir_name` writes (`%2F`, not `%2f`).
    (dir_name(&prefix).ok()? == name).then_some(prefix)
}

/// Refuses a directory on a network filesystem: `flock` there is either
/// local to one client (other hosts do not see it) or emulated with locks
/// that a lost connection drops, so neither "at most N" nor "gone when
/// consem dies" would hold.
#[cfg(target_os = "linux")]
fn refuse_network_filesystem(path: &Path) -> Result<(), StoreError> {
    const NETWORK: [(i64, &str); 7] = [
        (0x6969, "NFS"),
        (0x517B, "SMB"),
        (0xFF53_4D42, "CIFS"),
        (0xFE53_4D42, "SMB2"),
        (0x00C3_6400, "Ceph"),
        (0x5346_414F, "AFS"),
        (0x0102_1997, "9P"),
    ];
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return Ok(());
    };
    // SAFETY: statfs writes into the zeroed struct we own.
    let mut info: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_path.as_ptr(), &mut info) } != 0 {
        return Ok(());
    }
    #[allow(clippy::unnecessary_cast)]
    let kind = info.f_type as i64;
    match NETWORK.iter().find(|(magic, _)| *magic == kind) {
        Some((_, name)) => Err(StoreError::usage(format!(
            "{} is on {name}, a network filesystem, where file locks do not hold slots reliably: use a local directory (--store local:DIR), or a store with a server (Consul, Redis, etcd) for slots across hosts",
            path.display()
        ))),
        None => Ok(()),
    }
}

#[cfg(not(target_os = "linux"))]
fn refuse_network_filesystem(_path: &Path) -> Result<(), StoreError> {
    Ok(())
}

impl PrefixDir {
    /// The prefix's directory under `base`, created (with `base`) if
    /// missing when `create`.
    pub fn open(base: &Path, prefix: &str, create: bool) -> Result<PrefixDir, StoreError> {
        if create && !base.exists() {
            // The shared default is open to every user, as /tmp is: anyone
            // may add a prefix, nobody may remove another user's.
            let shared_default = base == Path::new("/run/lock/consem");
            let mut builder = fs::DirBuilder::new();
            builder.recursive(true);
            if shared_default {
                builder.mode(0o1777);
            } else {
                builder.mode(0o700);
            }
            builder
                .create(base)
                .map_err(|e| io_error("cannot create the local store's directory", base, e))?;
            if shared_default {
                let _ = fs::set_permissions(base, fs::Permissions::from_mode(0o1777));
            }
        }
        let metadata = fs::metadata(base)
            .map_err(|e| io_error("cannot use the local store's directory", base, e))?;
        if !metadata.is_dir() {
            return Err(StoreError::usage(format!(
                "{} is not a directory: give --store local:DIR a directory",
                base.display()
            )));
        }
        refuse_network_filesystem(base)?;
        let shared = metadata.permissions().mode() & 0o002 != 0;
        let path = base.join(dir_name(prefix)?);
        if create && !path.exists() {
            // Sticky, as /tmp: every user may add files, none may remove or
            // replace another's.
            match fs::DirBuilder::new()
                .mode(if shared { 0o1777 } else { 0o755 })
                .create(&path)
            {
                Ok(()) if shared => {
                    let _ = fs::set_permissions(&path, fs::Permissions::from_mode(0o1777));
                }
                Ok(()) => {}
                // Another contender made it first.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_error("cannot create", &path, e)),
            }
        }
        if let Ok(metadata) = fs::symlink_metadata(&path) {
            let mode = metadata.permissions().mode();
            if metadata.file_type().is_symlink() || !metadata.is_dir() {
                return Err(StoreError::denied(format!(
                    "{} is not a directory (a link, or a file): consem will not follow it; remove it",
                    path.display()
                )));
            }
            if mode & 0o002 != 0 && mode & 0o1000 == 0 {
                return Err(StoreError::denied(format!(
                    "{} is writable by every user without the sticky bit, so anyone could replace the semaphore's files: chmod +t it, or remove it",
                    path.display()
                )));
            }
        }
        Ok(PrefixDir { path, shared })
    }

    /// The prefix's directory if it exists.
    pub fn open_existing(base: &Path, prefix: &str) -> Result<Option<PrefixDir>, StoreError> {
        let path = base.join(dir_name(prefix)?);
        if !path.is_dir() {
            return Ok(None);
        }
        PrefixDir::open(base, prefix, false).map(Some)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens a file of the directory for reading, never through a link:
    /// in a shared directory another user may have put one where our file
    /// belongs. Non-blocking, so that a FIFO put there does not hang us.
    fn open_read(path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
    }

    /// The mode of `meta` and `state`, which every contender rewrites.
    fn rewritten_mode(&self) -> u32 {
        if self.shared {
            0o666
        } else {
            0o600
        }
    }

    /// The mode of a contender's locked files: others read them to probe
    /// or wait on their locks (`flock` needs no more).
    fn locked_mode(&self) -> u32 {
        if self.shared {
            0o644
        } else {
            0o600
        }
    }

    /// Creates `path`, never over a file or through a link, with `mode`:
    /// set again with fchmod, since the umask takes off bits that the
    /// other users need. A file it cannot give that mode is removed.
    fn create_file(path: &Path, mode: u32) -> io::Result<File> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)?;
        if let Err(error) = file.set_permissions(fs::Permissions::from_mode(mode)) {
            let _ = fs::remove_file(path);
            return Err(error);
        }
        Ok(file)
    }

    /// Gives a file of ours that every contender rewrites the mode that
    /// lets them, where an older consem (or a umask) made it without.
    fn repair_mode(&self, file: &File, mode: u32) {
        if let Ok(metadata) = file.metadata() {
            if self.shared && metadata.uid() == effective_uid() && metadata.mode() & 0o777 != mode {
                let _ = file.set_permissions(fs::Permissions::from_mode(mode));
            }
        }
    }

    /// What to say when this user may not use `path`, a file that every
    /// contender uses: who can fix it, and how.
    fn denied(&self, what: &str, path: &Path, error: io::Error) -> StoreError {
        match fs::symlink_metadata(path) {
            Ok(metadata)
                if error.kind() == io::ErrorKind::PermissionDenied
                    && metadata.uid() != effective_uid() =>
            {
                let owner = user_name(metadata.uid());
                StoreError::denied(format!(
                    "{what} {}: {error}; it belongs to {owner} with mode {:o}, which other users cannot use (an older consem made it so, or a hand edit): the next consem that {owner} runs on this prefix fixes its mode, or root can remove it (consem makes it again)",
                    path.display(),
                    metadata.mode() & 0o7777
                ))
            }
            _ => io_error(what, path, error),
        }
    }

    /// Opens `meta`, creating it (writable by all who share the directory:
    /// they lock it, and raise the fence floor in it).
    fn meta(&self) -> Result<File, StoreError> {
        let path = self.path.join("meta");
        let opened = match PrefixDir::open_read(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match PrefixDir::create_file(&path, self.rewritten_mode()) {
                    // Another contender made it first.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        PrefixDir::open_read(&path)
                    }
                    created => created,
                }
            }
            opened => opened.inspect(|file| self.repair_mode(file, self.rewritten_mode())),
        };
        opened.map_err(|e| self.denied("cannot open", &path, e))
    }

    /// Takes the directory's lock, waiting for it.
    pub fn lock(&self) -> Result<MetaLock, StoreError> {
        let meta = self.meta()?;
        flock(&meta, libc::LOCK_EX)
            .map_err(|e| io_error("cannot lock", &self.path.join("meta"), e))?;
        Ok(MetaLock(meta))
    }

    /// Takes the directory's lock to read it, creating and mending
    /// nothing; `None` when the directory has no `meta` (no contender
    /// ever got that far).
    pub fn lock_to_read(&self) -> Result<Option<MetaLock>, StoreError> {
        let path = self.path.join("meta");
        let meta = match PrefixDir::open_read(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.denied("cannot open", &path, e)),
        };
        flock(&meta, libc::LOCK_SH).map_err(|e| io_error("cannot lock", &path, e))?;
        Ok(Some(MetaLock(meta)))
    }

    /// Takes the directory's lock unless another process keeps it past
    /// `deadline` (a frozen process inside its few milliseconds of work).
    pub fn lock_within(&self, deadline: Instant) -> Result<MetaLock, StoreError> {
        let meta = self.meta()?;
        loop {
            match flock(&meta, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(()) => return Ok(MetaLock(meta)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(LOCK_RETRY)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(StoreError::unavailable(format!(
                        "another process kept {} locked",
                        self.path.join("meta").display()
                    )))
                }
                Err(e) => return Err(io_error("cannot lock", &self.path.join("meta"), e)),
            }
        }
    }

    /// The fence floor kept in `meta`: at least every fence handed out.
    fn fence_floor(&self) -> u64 {
        let mut bytes = [0u8; FLOOR_LEN + 1];
        let read = PrefixDir::open_read(&self.path.join("meta"))
            .and_then(|file| file.read_at(&mut bytes, 0))
            .unwrap_or(0);
        record::decode_floor(&bytes[..read])
    }

    /// Raises the fence floor in `meta` to `fence`, which is about to be
    /// handed out, so that a record lost afterwards does not hand it out
    /// again. A `meta` that this user may not write (one an older consem
    /// made) keeps no floor; the slot is taken all the same.
    pub fn raise_fence_floor(&self, fence: u64) {
        if let Ok(meta) = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.path.join("meta"))
        {
            let _ = meta.write_all_at(&record::encode_floor(fence), 0);
        }
    }

    /// The prefix's record; rebuilt from the files present when `state` is
    /// missing or was cut short (see `decide::rebuild`). Call with the
    /// directory locked.
    pub fn read_state(&self) -> Result<State, StoreError> {
        let path = self.path.join("state");
        let bytes = match PrefixDir::open_read(&path).and_then(|mut file| {
            let mut bytes = Vec::new();
            io::Read::read_to_end(&mut file, &mut bytes).map(|_| bytes)
        }) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return self.rebuild_state(),
            Err(e) => return Err(self.denied("cannot read", &path, e)),
        };
        match record::decode(&bytes) {
            Read::Whole(state) => Ok(state),
            Read::Older(state) => Ok(State {
                waiting_from: decide::waiting_from(&self.found()?, state.next),
                ..state
            }),
            Read::CutShort => self.rebuild_state(),
            Read::Foreign(error) => Err(StoreError::conflict(format!(
                "{} is not a consem local semaphore record ({error}); consem leaves it untouched (delete it if it is stale)",
                path.display()
            ))),
        }
    }

    fn rebuild_state(&self) -> Result<State, StoreError> {
        Ok(decide::rebuild(&self.found()?, self.fence_floor()))
    }

    /// What the files present show of every ticket, in ticket order.
    fn found(&self) -> Result<Vec<Found>, StoreError> {
        Ok(self
            .scan()?
            .into_iter()
            .map(|(ticket, present)| {
                let live = present.contender && self.is_live(ticket);
                Found {
                    ticket,
                    live,
                    queued: present.queue,
                    limit: live.then(|| self.joined_with(ticket)).flatten(),
                }
            })
            .collect())
    }

    /// Rewrites `state` in place (in a shared directory, nobody may rename
    /// over another user's file). Call with the directory locked.
    pub fn write_state(&self, state: &State) -> Result<(), StoreError> {
        let path = self.path.join("state");
        let bytes = record::encode(state);
        let write = || -> io::Result<()> {
            // Never O_CREAT on a file that may be there: with
            // fs.protected_regular, the kernel refuses that on another
            // user's file in a sticky directory even where we may write it.
            let file = match OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
            {
                Ok(file) => {
                    self.repair_mode(&file, self.rewritten_mode());
                    file
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    PrefixDir::create_file(&path, self.rewritten_mode())?
                }
                Err(e) => return Err(e),
            };
            // The whole record, then the cut to its length: stopped
            // anywhere, what is left fails its check (record.rs).
            file.write_all_at(&bytes, 0)?;
            file.set_len(bytes.len() as u64)
        };
        write().map_err(|e| self.denied("cannot write", &path, e))
    }

    pub fn contender_path(&self, ticket: u64) -> PathBuf {
        self.path.join(format!("{ticket}.c"))
    }

    fn queue_path(&self, ticket: u64) -> PathBuf {
        self.path.join(format!("{ticket}.q"))
    }

    fn wake_path(&self, ticket: u64) -> PathBuf {
        self.path.join(format!("{ticket}.w"))
    }

    fn ticket_paths(&self, ticket: u64) -> [PathBuf; 3] {
        [
            self.contender_path(ticket),
            self.queue_path(ticket),
            self.wake_path(ticket),
        ]
    }

    /// Wakes the holder `ticket` (after its place in the record changed).
    /// A holder that is gone has no reader: the open fails, which is fine.
    pub fn wake_holder(&self, ticket: u64) {
        if let Ok(mut fifo) = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(self.wake_path(ticket))
        {
            let _ = fifo.write_all(b"!");
        }
    }

    /// Takes the first ticket from `next` on that no file uses, and makes
    /// its files: the contender file (locked, with our description and
    /// limit), the queue file (locked) and the wake FIFO. Each is made only
    /// where no file is (`O_EXCL`, `mkfifo`): a ticket with any file left
    /// there is passed over, without listing the directory. All or nothing:
    /// a failure removes what it made. Call with the directory locked.
    pub fn create_contender(
        &self,
        next: u64,
        info: &ContenderInfo,
        limit: u32,
    ) -> Result<Joined, StoreError> {
        let mut description = info.to_json();
        description.insert("Limit".into(), limit.into());
        let description = serde_json::to_vec(&description).expect("a description always encodes");
        for ticket in next.. {
            let mut made = Vec::new();
            match self.create_contender_files(ticket, &description, &mut made) {
                Ok(joined) => return Ok(joined),
                Err((path, error)) => {
                    for path in made {
                        let _ = fs::remove_file(path);
                    }
                    if error.kind() != io::ErrorKind::AlreadyExists {
                        return Err(io_error("cannot create", &path, error));
                    }
                    // A file left there (by a crash, another user, or by
                    // hand): that ticket is taken.
                }
            }
        }
        unreachable!("tickets run out only after u64::MAX joins")
    }

    /// Makes `ticket`'s files, noting each in `made` as soon as it exists.
    fn create_contender_files(
        &self,
        ticket: u64,
        description: &[u8],
        made: &mut Vec<PathBuf>,
    ) -> Result<Joined, (PathBuf, io::Error)> {
        let mut create_locked = |path: PathBuf| -> Result<File, (PathBuf, io::Error)> {
            let file =
                PrefixDir::create_file(&path, self.locked_mode()).map_err(|e| (path.clone(), e))?;
            made.push(path.clone());
            flock(&file, libc::LOCK_EX | libc::LOCK_NB).map_err(|e| (path, e))?;
            Ok(file)
        };
        let contender_path = self.contender_path(ticket);
        let mut contender = create_locked(contender_path.clone())?;
        contender
            .write_all(description)
            .map_err(|e| (contender_path, e))?;
        let queue = create_locked(self.queue_path(ticket))?;
        // Made now, off the path of a handoff: once we hold a slot, an
        // operator who releases us writes to it to wake us.
        let wake = self.create_wake_fifo(ticket, made)?;
        Ok(Joined {
            ticket,
            contender,
            queue,
            wake,
        })
    }

    /// Makes the FIFO that wakes the holder `ticket` and opens its ends.
    fn create_wake_fifo(
        &self,
        ticket: u64,
        made: &mut Vec<PathBuf>,
    ) -> Result<WakeFifo, (PathBuf, io::Error)> {
        let path = self.wake_path(ticket);
        let failed = |e: io::Error| (path.clone(), e);
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|e| failed(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        // Others who share the directory open it to write.
        let mode = if self.shared { 0o622 } else { 0o600 };
        // SAFETY: mkfifo reads the NUL-terminated path.
        if unsafe { libc::mkfifo(c_path.as_ptr(), mode) } != 0 {
            return Err(failed(io::Error::last_os_error()));
        }
        made.push(path.clone());
        // Non-blocking: a FIFO's read end would otherwise wait for a writer.
        let open = |write: bool| {
            OpenOptions::new()
                .read(!write)
                .write(write)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
                .open(&path)
                .map_err(failed)
        };
        let file = open(false)?;
        // Past the umask, which takes off the bits the others need.
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(failed)?;
        // A write end of our own keeps the FIFO from reporting a hang-up
        // (which poll would answer at once, again and again) once the
        // operator who wrote closes it.
        let writer = open(true)?;
        Ok(WakeFifo {
            file,
            _writer: writer,
        })
    }

    /// Every ticket that has a file here, and which files, in order of
    /// arrival. Only names consem makes count (`7.c`, not `007.c`).
    fn scan(&self) -> Result<BTreeMap<u64, Present>, StoreError> {
        let entries =
            fs::read_dir(&self.path).map_err(|e| io_error("cannot list", &self.path, e))?;
        let mut tickets: BTreeMap<u64, Present> = BTreeMap::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some((stem, kind)) = name.to_str().and_then(|n| n.rsplit_once('.')) else {
                continue;
            };
            let Ok(ticket) = stem.parse::<u64>() else {
                continue;
            };
            if ticket.to_string() != stem || !["c", "q", "w"].contains(&kind) {
                continue;
            }
            let present = tickets.entry(ticket).or_default();
            present.contender |= kind == "c";
            present.queue |= kind == "q";
        }
        Ok(tickets)
    }

    /// Whether the contender `ticket` is alive: its file's lock is held.
    fn is_live(&self, ticket: u64) -> bool {
        match PrefixDir::open_read(&self.contender_path(ticket)) {
            Ok(file) => {
                matches!(flock(&file, libc::LOCK_SH | libc::LOCK_NB), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            // A file we may not read (another user's, made by an older
            // consem or chmodded by hand): counted as live, so that the
            // limit holds; its owner or root prunes it if it is dead.
            Err(e) => e.kind() == io::ErrorKind::PermissionDenied,
        }
    }

    /// The `--limit` the contender `ticket` joined with.
    fn joined_with(&self, ticket: u64) -> Option<u32> {
        let bytes = self.read_contender_file(ticket).ok()?;
        serde_json::from_slice::<JoinedWith>(&bytes).ok()?.limit
    }

    /// Whether any contender is alive (the first one found ends the look).
    pub fn anyone_live(&self) -> Result<bool, StoreError> {
        Ok(self
            .scan()?
            .into_iter()
            .any(|(t, present)| present.contender && self.is_live(t)))
    }

    /// The live contenders' tickets, in order of arrival.
    pub fn live_tickets(&self) -> Result<Vec<u64>, StoreError> {
        Ok(self
            .scan()?
            .into_iter()
            .filter(|&(t, present)| present.contender && self.is_live(t))
            .map(|(t, _)| t)
            .collect())
    }

    /// Drops the dead holders from `state` (the caller writes it if it
    /// writes anyway) and removes their files where it may (another user's
    /// stay, skipped: see `stale_files`). Looks at the holders only: at most
    /// `limit` of them. Call with the directory locked.
    pub fn prune_holders(&self, state: &mut State) {
        state.holders.retain(|&ticket| {
            let live = self.is_live(ticket);
            if !live {
                self.remove_files(ticket);
            }
            live
        });
    }

    /// What `ticket`'s queue file shows: a waiter locks it while it waits,
    /// and the kernel unlocks it when the waiter dies; a dead waiter's files
    /// are removed where this user may. Call with the directory locked.
    pub fn look_at_waiter(&self, ticket: u64) -> Seen {
        match PrefixDir::open_read(&self.queue_path(ticket)) {
            Ok(file) => match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Seen::Waiting,
                _ => {
                    drop(file);
                    self.remove_files(ticket);
                    Seen::Dead
                }
            },
            // Another user's that we may not read (made by an older consem,
            // or chmodded by hand): counted as waiting, as `is_live` does.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Seen::Waiting,
            Err(_) => Seen::NotWaiting,
        }
    }

    /// Drops every dead contender: the dead holders from `state`, and the
    /// files of every dead one where this user may. Lists the directory:
    /// for the last one out, when nobody waits. Call with the directory
    /// locked.
    fn prune_all(&self, state: &mut State) -> Result<(), StoreError> {
        let mut live = BTreeSet::new();
        for (ticket, present) in self.scan()? {
            if present.contender && self.is_live(ticket) {
                live.insert(ticket);
            } else {
                self.remove_files(ticket);
            }
        }
        state.holders.retain(|t| live.contains(t));
        Ok(())
    }

    /// Removes `ticket`'s files; returns those that stay (another user's,
    /// in a sticky directory).
    pub fn remove_files(&self, ticket: u64) -> Vec<PathBuf> {
        self.ticket_paths(ticket)
            .into_iter()
            .filter(|path| matches!(fs::remove_file(path), Err(e) if e.kind() != io::ErrorKind::NotFound))
            .collect()
    }

    /// The files of contenders that are gone: dead (their contender file
    /// unlocked), or without a contender file. Contenders skip them.
    /// Call with the directory locked.
    pub fn stale_files(&self) -> Result<Vec<StaleFile>, StoreError> {
        let mut stale = Vec::new();
        for (ticket, present) in self.scan()? {
            if present.contender && self.is_live(ticket) {
                continue;
            }
            for path in self.ticket_paths(ticket) {
                if let Ok(metadata) = fs::symlink_metadata(&path) {
                    stale.push(StaleFile {
                        ticket,
                        path,
                        owner: metadata.uid(),
                    });
                }
            }
        }
        Ok(stale)
    }

    /// Removes the `stale` files it may; returns those that stay (another
    /// user's, in a sticky directory). Call with the directory locked.
    pub fn remove_stale_files(&self, stale: &[StaleFile]) -> Vec<StaleFile> {
        stale
            .iter()
            .filter(|file| matches!(fs::remove_file(&file.path), Err(e) if e.kind() != io::ErrorKind::NotFound))
            .cloned()
            .collect()
    }

    fn read_contender_file(&self, ticket: u64) -> io::Result<Vec<u8>> {
        PrefixDir::open_read(&self.contender_path(ticket)).and_then(|mut file| {
            let mut bytes = Vec::new();
            io::Read::read_to_end(&mut file, &mut bytes).map(|_| bytes)
        })
    }

    /// A contender's description, as it wrote it.
    pub fn describe(&self, ticket: u64) -> ContenderInfo {
        self.read_contender_file(ticket)
            .map(|bytes| ContenderInfo::parse(&bytes))
            .unwrap_or_default()
    }

    /// Whether `ticket`'s contender file is still `ours` (the file we made
    /// and hold locked): not deleted, and not replaced by another
    /// contender's of the same ticket in a directory made again since.
    pub fn contender_file_is(&self, ticket: u64, ours: &File) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        match (fs::metadata(self.contender_path(ticket)), ours.metadata()) {
            (Ok(found), Ok(ours)) => found.dev() == ours.dev() && found.ino() == ours.ino(),
            _ => false,
        }
    }

    /// Unlinks our queue file; closing it (the caller drops it) wakes the
    /// waiter blocked on it.
    pub fn remove_queue_file(&self, ticket: u64) {
        let _ = fs::remove_file(self.queue_path(ticket));
    }

    /// Blocks until the waiter `ticket` unlocks its queue file: it took its
    /// slot, left, or died.
    pub fn wait_for_queue_file(&self, ticket: u64) {
        if let Ok(file) = PrefixDir::open_read(&self.queue_path(ticket)) {
            let _ = flock(&file, libc::LOCK_SH);
        }
    }

    /// Leaves: out of the holders, our files gone, the limit record
    /// dropped if nobody else contends. Call with the directory locked.
    pub fn leave(&self, ticket: u64) -> Result<(), StoreError> {
        let mut state = self.read_state()?;
        self.remove_files(ticket);
        state.holders.retain(|&t| t != ticket);
        self.prune_holders(&mut state);
        // A live holder, or else the first live waiter, ends the look: a
        // handoff waits for this. Only the last one out lists the
        // directory, to tidy every dead contender's files up, and drops
        // the limit.
        let anyone_left = !state.holders.is_empty()
            || decide::first_waiter(state.waiting_from, state.next, |t| self.look_at_waiter(t))
                .is_some();
        if !anyone_left {
            self.prune_all(&mut state)?;
            state.limit = None;
        }
        self.write_state(&state)
    }
}

fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor we own; no memory is touched.
        if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// The read end of a holder's wake FIFO: an operator who takes it out of
/// the record writes to it.
pub struct WakeFifo {
    file: File,
    _writer: File,
}

impl WakeFifo {
    /// Sleeps until someone writes, or `recheck` passes; empties the FIFO.
    pub fn wait(&self, recheck: Duration) {
        if poll_readable(&self.file, recheck) {
            use std::io::Read as _;
            let mut buffer = [0u8; 64];
            while matches!((&self.file).read(&mut buffer), Ok(n) if n > 0) {}
        }
    }
}

/// Waits until `file` can be read or `within` passes; true if it can.
fn poll_readable(file: &File, within: Duration) -> bool {
    let mut poll = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = libc::c_int::try_from(within.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one pollfd that we own.
    let ready = unsafe { libc::poll(&mut poll, 1, millis) };
    ready > 0 && poll.revents & libc::POLLIN != 0
}

/// Wakes a waiter or a holder when the prefix's directory changes: a
/// contender file deleted or closed by a dying process, or `state`
/// rewritten. On Linux through inotify; elsewhere, or where this user
/// reached the kernel's inotify limits, by looking again every
/// `LOOK_WITHOUT_WATCH`.
pub struct Waker {
    /// None where the kernel refused this user another inotify instance or
    /// watch: a crowd of queues must not fail for it, only look more often.
    #[cfg(target_os = "linux")]
    watch: Option<Watch>,
    /// The waiter's ticket.
    #[cfg(target_os = "linux")]
    me: u64,
    /// What changed since `take_change` was last called.
    change: Change,
}

/// An inotify descriptor and its one watch, of the prefix's directory.
#[cfg(target_os = "linux")]
struct Watch {
    inotify: File,
    id: libc::c_int,
}

/// How often a waiter without a watch looks again.
const LOOK_WITHOUT_WATCH: Duration = Duration::from_millis(250);

/// What changed in the directory since the first waiter last looked, as far
/// as its turn goes; the greater wins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// Nothing that may give it its slot (or the time to look again came).
    #[default]
    Nothing,
    /// `state` was rewritten: the record may say something new, or only
    /// that a contender joined behind it.
    Record,
    /// The files of a contender ahead of it (a holder leaving or dying), or
    /// anything else: it looks at the holders again.
    Ahead,
}

/// What a change to the file `name` is to the first waiter, `me`: nothing
/// for the close of `meta` (opened to raise the fence floor, or made), nor
/// for the files of a contender behind it (one joining, leaving or dying
/// behind it changes nothing ahead), which in a crowd are most of the
/// directory's changes.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn change_to(name: &[u8], me: u64) -> Change {
    if name == b"meta" {
        return Change::Nothing;
    }
    if name == b"state" {
        return Change::Record;
    }
    let ticket = std::str::from_utf8(name)
        .ok()
        .and_then(|name| name.rsplit_once('.'))
        .and_then(|(stem, _)| stem.parse::<u64>().ok());
    match ticket {
        Some(ticket) if ticket > me => Change::Nothing,
        _ => Change::Ahead,
    }
}

/// The kernel's per-user inotify setting that `error` says was reached
/// (EMFILE: instances; ENOSPC: watches), if it says so.
#[cfg(target_os = "linux")]
fn inotify_limit(error: &io::Error, limit_errno: libc::c_int) -> Option<&'static str> {
    match error.raw_os_error() {
        Some(errno) if errno == limit_errno && errno == libc::EMFILE => {
            Some("fs.inotify.max_user_instances")
        }
        Some(errno) if errno == limit_errno && errno == libc::ENOSPC => {
            Some("fs.inotify.max_user_watches")
        }
        _ => None,
    }
}

#[cfg(target_os = "linux")]
impl Waker {
    /// Watches `dir` for the waiter `me`; where this user reached the
    /// kernel's inotify limits, says so once and looks again every
    /// `LOOK_WITHOUT_WATCH` instead.
    pub fn new(dir: &Path, me: u64) -> Result<Waker, StoreError> {
        let watch = match Watch::new(dir) {
            Ok(watch) => Some(watch),
            Err((error, limit_errno)) => match inotify_limit(&error, limit_errno) {
                Some(setting) => {
                    crate::report::warning(&format!(
                        "cannot watch {}: {error}: this user reached the kernel's {setting}; looking again every {} ms instead (raise it: sysctl -w {setting}=N, or in /etc/sysctl.d)",
                        dir.display(),
                        LOOK_WITHOUT_WATCH.as_millis()
                    ));
                    None
                }
                None => return Err(io_error("cannot watch", dir, error)),
            },
        };
        Ok(Waker {
            watch,
            me,
            change: Change::Nothing,
        })
    }

    /// Reads what is pending into what changed (see `change_to`).
    pub fn drain(&mut self) {
        use std::io::Read as _;
        let Some(watch) = &mut self.watch else {
            return;
        };
        let mut buffer = [0u8; 4096];
        while let Ok(read) = watch.inotify.read(&mut buffer) {
            if read == 0 {
                break;
            }
            let mut at = 0;
            const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
            while at + HEADER <= read {
                // SAFETY: the kernel writes whole events; read_unaligned
                // copies the header out of the byte buffer.
                let event: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buffer[at..].as_ptr().cast()) };
                let name = &buffer[at + HEADER..(at + HEADER + event.len as usize).min(read)];
                let name = name.split(|&b| b == 0).next().unwrap_or_default();
                self.change = self.change.max(change_to(name, self.me));
                at += HEADER + event.len as usize;
            }
        }
    }

    /// Sleeps until something relevant happens in the directory, or
    /// `recheck` passes (without a watch, `LOOK_WITHOUT_WATCH` at most).
    pub fn wait(&mut self, recheck: Duration) {
        if self.watch.is_none() {
            std::thread::sleep(recheck.min(LOOK_WITHOUT_WATCH));
            return;
        }
        let deadline = Instant::now() + recheck;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let readable = self
                .watch
                .as_ref()
                .is_some_and(|watch| poll_readable(&watch.inotify, left));
            if readable {
                self.drain();
                if self.change != Change::Nothing {
                    return;
                }
            }
        }
    }

    /// What changed since the last call; without a watch, anything may
    /// have, and every look is a full one.
    pub fn take_change(&mut self) -> Change {
        if self.watch.is_none() {
            return Change::Ahead;
        }
        std::mem::take(&mut self.change)
    }

    /// Stops watching, and closes the descriptor on a thread of its own:
    /// closing one waits for a kernel grace period (about 10 ms), which the
    /// slot just taken must not wait for, and keeping it until the process
    /// exits would hold one of this user's inotify instances
    /// (`fs.inotify.max_user_instances`, 128 by default) for the whole
    /// command. Where no thread can be started, it is kept until exit.
    pub fn retire(self) {
        use std::os::fd::{FromRawFd as _, IntoRawFd as _};
        let Some(watch) = self.watch else {
            return;
        };
        // SAFETY: removes the one watch of our own inotify descriptor; an
        // error only means it is already gone.
        unsafe { libc::inotify_rm_watch(watch.inotify.as_raw_fd(), watch.id) };
        let fd = watch.inotify.into_raw_fd();
        let _ = std::thread::Builder::new()
            .name("consem-unwatch".into())
            // SAFETY: fd is ours alone: taken out of its File above.
            .spawn(move || drop(unsafe { File::from_raw_fd(fd) }));
    }
}

#[cfg(target_os = "linux")]
impl Watch {
    /// An inotify descriptor watching `dir`; an error comes with the errno
    /// that would mean the kernel's per-user limit for the step that failed.
    fn new(dir: &Path) -> Result<Watch, (io::Error, libc::c_int)> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: inotify_init1 returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err((io::Error::last_os_error(), libc::EMFILE));
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let inotify = unsafe { File::from_raw_fd(fd) };
        let c_path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|_| (io::Error::from(io::ErrorKind::InvalidInput), 0))?;
        let mask = libc::IN_DELETE | libc::IN_CLOSE_WRITE;
        // SAFETY: reads the NUL-terminated path; fd is ours.
        let id = unsafe { libc::inotify_add_watch(fd, c_path.as_ptr(), mask) };
        if id < 0 {
            return Err((io::Error::last_os_error(), libc::ENOSPC));
        }
        Ok(Watch { inotify, id })
    }
}

#[cfg(not(target_os = "linux"))]
impl Waker {
    pub fn new(_dir: &Path, _me: u64) -> Result<Waker, StoreError> {
        Ok(Waker {
            change: Change::Nothing,
        })
    }

    pub fn drain(&mut self) {}

    /// Without inotify every look is a full one.
    pub fn take_change(&mut self) -> Change {
        Change::Ahead
    }

    pub fn wait(&mut self, recheck: Duration) {
        std::thread::sleep(recheck.min(LOOK_WITHOUT_WATCH));
    }

    pub fn retire(self) {}
}

#[cfg(test)]
mod tests {
    use super::{change_to, Change};
    use std::io;

    #[test]
    fn a_directory_name_gives_back_its_prefix() {
        for prefix in ["jobs/nightly", "a b/ü", "{jobs}", "x%41"] {
            let name = super::dir_name(prefix).unwrap();
            assert_eq!(super::prefix_of(&name).as_deref(), Some(prefix), "{name}");
        }
        // Names `dir_name` does not write are nobody's.
        for name in ["jobs%2fa", "a%2", "a%zz", "a b", "%FF", "lost+found"] {
            assert_eq!(super::prefix_of(name), None, "{name}");
        }
    }

    #[test]
    fn the_first_waiter_wakes_for_changes_ahead_of_it_only() {
        let me = 40;
        assert_eq!(change_to(b"state", me), Change::Record);
        // An overflowing queue's event has no name.
        for ahead in ["39.c", "3.w", "40.q", "stray", ""] {
            assert_eq!(change_to(ahead.as_bytes(), me), Change::Ahead, "{ahead}");
        }
        for behind in ["meta", "41.c", "41.q", "1000.w"] {
            assert_eq!(
                change_to(behind.as_bytes(), me),
                Change::Nothing,
                "{behind}"
            );
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_kernel_s_limits_on_watching_are_told_from_other_errors() {
        use super::inotify_limit;
        let error = io::Error::from_raw_os_error;
        assert_eq!(
            inotify_limit(&error(libc::EMFILE), libc::EMFILE),
            Some("fs.inotify.max_user_instances")
        );
        assert_eq!(
            inotify_limit(&error(libc::ENOSPC), libc::ENOSPC),
            Some("fs.inotify.max_user_watches")
        );
        // The same errno from the other step, or another error, is no limit.
        assert_eq!(inotify_limit(&error(libc::ENOSPC), libc::EMFILE), None);
        assert_eq!(inotify_limit(&error(libc::ENOENT), libc::EMFILE), None);
    }

    /// A waiter the kernel refused a watch still wakes: it looks again
    /// within a quarter of a second, and each look is a full one.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_waiter_without_a_watch_looks_again_soon_and_fully() {
        let mut waker = super::Waker {
            watch: None,
            me: 7,
            change: Change::Nothing,
        };
        let started = std::time::Instant::now();
        waker.wait(std::time::Duration::from_secs(60));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(waker.take_change(), Change::Ahead);
    }
}
