//! The local store's files and kernel locks. Every decision is made while
//! holding the `flock` of the prefix's `meta` file; a contender is live
//! while its `<ticket>.c` file is locked, which the kernel undoes when the
//! process dies.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::store::{ContenderInfo, StoreError};

/// The longest directory name a prefix may take, percent-encoded.
const MAX_NAME: usize = 200;

/// How often `lock_within` tries again while another process holds `meta`.
const LOCK_RETRY: Duration = Duration::from_millis(10);

/// The prefix's record, replaced as a whole with a rename.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// `None` once nobody contends (after the last one leaves, or a reset):
    /// the next contender sets it.
    pub limit: Option<u32>,
    /// The next ticket: tickets give the order of arrival.
    pub next: u64,
    /// The last fence handed out; never reset, so it grows from one
    /// acquisition to the next for the life of the directory.
    pub fence: u64,
    pub holders: Vec<u64>,
}

/// The directory of one prefix.
pub struct PrefixDir {
    path: PathBuf,
    /// Other users may join: files are made readable by all, and the
    /// directory writable by all.
    shared: bool,
}

/// Holds the `flock` of `meta` until dropped.
pub struct MetaLock(#[allow(dead_code)] File);

fn io_error(what: &str, path: &Path, error: io::Error) -> StoreError {
    let message = format!("{what} {}: {error}", path.display());
    match error.kind() {
        io::ErrorKind::PermissionDenied => StoreError::Denied(format!(
            "{message}; use a directory this user can write: --store local:DIR"
        )),
        _ => StoreError::Unavailable(message),
    }
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
        return Err(StoreError::Usage(format!(
            "--prefix is too long for the local store ({} bytes once encoded as a file name, at most {MAX_NAME}): use a shorter one",
            name.len()
        )));
    }
    Ok(name)
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
        Some((_, name)) => Err(StoreError::Usage(format!(
            "{} is on {name}, a network filesystem, where file locks do not hold slots reliably: use a local directory (--store local:DIR), or the Consul store for slots across hosts",
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
            return Err(StoreError::Usage(format!(
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
                return Err(StoreError::Denied(format!(
                    "{} is not a directory (a link, or a file): consem will not follow it; remove it",
                    path.display()
                )));
            }
            if mode & 0o002 != 0 && mode & 0o1000 == 0 {
                return Err(StoreError::Denied(format!(
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
    /// belongs.
    fn open_read(path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
    }

    fn file_mode(&self) -> u32 {
        if self.shared {
            0o644
        } else {
            0o600
        }
    }

    /// Opens `meta`, creating it (writable by all who share the directory).
    fn meta(&self) -> Result<File, StoreError> {
        let path = self.path.join("meta");
        match PrefixDir::open_read(&path) {
            Ok(file) => Ok(file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .custom_flags(libc::O_NOFOLLOW)
                .mode(self.file_mode())
                .open(&path)
                .map_err(|e| io_error("cannot create", &path, e)),
            Err(e) => Err(io_error("cannot open", &path, e)),
        }
    }

    /// Takes the directory's lock, waiting for it.
    pub fn lock(&self) -> Result<MetaLock, StoreError> {
        let meta = self.meta()?;
        flock(&meta, libc::LOCK_EX)
            .map_err(|e| io_error("cannot lock", &self.path.join("meta"), e))?;
        Ok(MetaLock(meta))
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
                    return Err(StoreError::Unavailable(format!(
                        "another process kept {} locked",
                        self.path.join("meta").display()
                    )))
                }
                Err(e) => return Err(io_error("cannot lock", &self.path.join("meta"), e)),
            }
        }
    }

    pub fn read_state(&self) -> Result<State, StoreError> {
        let path = self.path.join("state");
        match PrefixDir::open_read(&path).and_then(|mut file| {
            let mut bytes = Vec::new();
            io::Read::read_to_end(&mut file, &mut bytes).map(|_| bytes)
        }) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                StoreError::Conflict(format!(
                    "{} is not a consem local semaphore record ({e}); consem leaves it untouched (delete it if it is stale)",
                    path.display()
                ))
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(io_error("cannot read", &path, e)),
        }
    }

    /// Replaces `state` with a rename, so that a reader never sees half of
    /// it and a crash leaves the old one.
    pub fn write_state(&self, state: &State) -> Result<(), StoreError> {
        let path = self.path.join("state");
        let temporary = self.path.join(format!("state.{}.tmp", std::process::id()));
        let write = || -> io::Result<()> {
            // A new file (O_EXCL never follows a link); one left by a consem
            // of the same pid that died is ours to remove.
            let create = || {
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(self.file_mode())
                    .open(&temporary)
            };
            let mut file = match create() {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    fs::remove_file(&temporary)?;
                    create()?
                }
                other => other?,
            };
            file.write_all(&serde_json::to_vec(state).expect("a state always encodes"))?;
            fs::rename(&temporary, &path)
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&temporary);
            io_error("cannot write", &path, e)
        })
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

    /// Makes the holder `ticket`'s wake FIFO and opens its read end.
    pub fn create_wake_fifo(&self, ticket: u64) -> Result<WakeFifo, StoreError> {
        let path = self.wake_path(ticket);
        let _ = fs::remove_file(&path);
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| StoreError::Usage(format!("{} has a NUL byte", path.display())))?;
        // Others who share the directory must be able to open it to write.
        let mode = if self.shared { 0o622 } else { 0o600 };
        // SAFETY: mkfifo reads the NUL-terminated path.
        if unsafe { libc::mkfifo(c_path.as_ptr(), mode) } != 0 {
            return Err(io_error("cannot create", &path, io::Error::last_os_error()));
        }
        if self.shared {
            let _ = fs::set_permissions(&path, fs::Permissions::from_mode(mode));
        }
        // Non-blocking: a FIFO's read end would otherwise wait for a writer.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| io_error("cannot open", &path, e))?;
        // A write end of our own keeps the FIFO from reporting a hang-up
        // (which poll would answer at once, again and again) once the
        // operator who wrote closes it.
        let writer = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| io_error("cannot open", &path, e))?;
        Ok(WakeFifo {
            file,
            _writer: writer,
        })
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

    /// Creates and locks our contender file (with our description) and
    /// queue file.
    pub fn create_contender(
        &self,
        ticket: u64,
        info: &ContenderInfo,
    ) -> Result<(File, File), StoreError> {
        let create = |path: &Path| -> Result<File, StoreError> {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(self.file_mode())
                .open(path)
                .map_err(|e| io_error("cannot create", path, e))?;
            flock(&file, libc::LOCK_EX | libc::LOCK_NB)
                .map_err(|e| io_error("cannot lock", path, e))?;
            Ok(file)
        };
        let contender_path = self.contender_path(ticket);
        let mut contender = create(&contender_path)?;
        contender
            .write_all(&serde_json::to_vec(info).expect("a description always encodes"))
            .map_err(|e| io_error("cannot write", &contender_path, e))?;
        let queue = create(&self.queue_path(ticket))?;
        Ok((contender, queue))
    }

    /// Every contender file's ticket, in order of arrival.
    fn tickets(&self) -> Result<Vec<u64>, StoreError> {
        let entries =
            fs::read_dir(&self.path).map_err(|e| io_error("cannot list", &self.path, e))?;
        let mut tickets: Vec<u64> = entries
            .filter_map(|entry| {
                let name = entry.ok()?.file_name();
                name.to_str()?.strip_suffix(".c")?.parse().ok()
            })
            .collect();
        tickets.sort_unstable();
        Ok(tickets)
    }

    /// Whether the contender `ticket` is alive: its file's lock is held.
    fn is_live(&self, ticket: u64) -> bool {
        match PrefixDir::open_read(&self.contender_path(ticket)) {
            Ok(file) => {
                matches!(flock(&file, libc::LOCK_SH | libc::LOCK_NB), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            Err(_) => false,
        }
    }

    /// Whether any contender is alive (the first one found ends the look).
    pub fn anyone_live(&self) -> Result<bool, StoreError> {
        Ok(self.tickets()?.into_iter().any(|t| self.is_live(t)))
    }

    /// The live contenders' tickets, in order of arrival.
    pub fn live_tickets(&self) -> Result<Vec<u64>, StoreError> {
        Ok(self
            .tickets()?
            .into_iter()
            .filter(|&t| self.is_live(t))
            .collect())
    }

    /// Looks at the holders and at the contenders that arrived before
    /// `before` (every one with `None`): removes the files of the dead ones
    /// and drops dead holders from `state` (the caller writes it if it
    /// writes anyway). Returns the live ones among them, in order of
    /// arrival. A waiter does not look at those behind it, which cannot
    /// change its turn. Call with the directory locked.
    pub fn prune_dead(
        &self,
        state: &mut State,
        before: Option<u64>,
    ) -> Result<Vec<u64>, StoreError> {
        let mut live = Vec::new();
        for ticket in self.tickets()? {
            let ahead = before.is_none_or(|before| ticket < before);
            if !ahead && !state.holders.contains(&ticket) {
                continue;
            }
            if self.is_live(ticket) {
                live.push(ticket);
            } else {
                self.remove_files(ticket);
            }
        }
        state.holders.retain(|t| live.contains(t));
        Ok(live)
    }

    fn remove_files(&self, ticket: u64) {
        for path in [
            self.contender_path(ticket),
            self.queue_path(ticket),
            self.wake_path(ticket),
        ] {
            let _ = fs::remove_file(path);
        }
    }

    /// A contender's description, as it wrote it.
    pub fn describe(&self, ticket: u64) -> ContenderInfo {
        PrefixDir::open_read(&self.contender_path(ticket))
            .and_then(|mut file| {
                let mut bytes = Vec::new();
                io::Read::read_to_end(&mut file, &mut bytes).map(|_| bytes)
            })
            .map(|bytes| ContenderInfo::parse(&bytes))
            .unwrap_or_default()
    }

    pub fn contender_file_exists(&self, ticket: u64) -> bool {
        self.contender_path(ticket).exists()
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
        state.holders.retain(|&t| t != ticket && self.is_live(t));
        // The first live contender found ends the look: a handoff waits for
        // this. Only the last one out tidies every dead contender's files up
        // and drops the limit.
        let anyone_left = !state.holders.is_empty() || self.anyone_live()?;
        if !anyone_left {
            self.prune_dead(&mut state, None)?;
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
/// replaced. On Linux through inotify; elsewhere by looking again every
/// quarter of a second.
pub struct Waker {
    #[cfg(target_os = "linux")]
    inotify: File,
    #[cfg(target_os = "linux")]
    watch: libc::c_int,
}

#[cfg(target_os = "linux")]
impl Waker {
    pub fn new(dir: &Path) -> Result<Waker, StoreError> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: inotify_init1 returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io_error("cannot watch", dir, io::Error::last_os_error()));
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let inotify = unsafe { File::from_raw_fd(fd) };
        let c_path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|_| StoreError::Usage(format!("{} has a NUL byte", dir.display())))?;
        let mask = libc::IN_DELETE | libc::IN_CLOSE_WRITE | libc::IN_MOVED_TO;
        // SAFETY: reads the NUL-terminated path; fd is ours.
        let watch = unsafe { libc::inotify_add_watch(fd, c_path.as_ptr(), mask) };
        if watch < 0 {
            return Err(io_error("cannot watch", dir, io::Error::last_os_error()));
        }
        Ok(Waker { inotify, watch })
    }

    /// Reads what is pending; true if any of it is worth looking again for
    /// (not the close of a temporary `state` file being written).
    pub fn drain(&mut self) -> bool {
        use std::io::Read as _;
        let mut relevant = false;
        let mut buffer = [0u8; 4096];
        while let Ok(read) = self.inotify.read(&mut buffer) {
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
                relevant |= !name.ends_with(b".tmp");
                at += HEADER + event.len as usize;
            }
        }
        relevant
    }

    /// Sleeps until something relevant happens in the directory, or
    /// `recheck` passes.
    pub fn wait(&mut self, recheck: Duration) {
        let deadline = Instant::now() + recheck;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            if poll_readable(&self.inotify, left) && self.drain() {
                return;
            }
        }
    }

    /// Stops watching, and keeps the descriptor open until the process
    /// exits: the kernel frees the watch in the background now, so that
    /// closing the descriptor at exit does not wait for it (about 10 ms).
    pub fn retire(self) {
        // SAFETY: removes the one watch (descriptor 1) of our own inotify
        // descriptor; an error only means it is already gone.
        unsafe { libc::inotify_rm_watch(self.inotify.as_raw_fd(), self.watch) };
        std::mem::forget(self.inotify);
    }
}

#[cfg(not(target_os = "linux"))]
impl Waker {
    pub fn new(_dir: &Path) -> Result<Waker, StoreError> {
        Ok(Waker {})
    }

    pub fn drain(&mut self) -> bool {
        false
    }

    pub fn wait(&mut self, recheck: Duration) {
        std::thread::sleep(recheck.min(Duration::from_millis(250)));
    }

    pub fn retire(self) {}
}
