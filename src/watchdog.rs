//! The lease watchdog: a small process, forked before the command starts,
//! that stops the command's process group when the slot can no longer be
//! counted on, even if consem itself cannot act (frozen by SIGSTOP or a
//! cgroup freezer, starved of CPU, or killed).
//!
//! consem tells it, over a pipe, the command's process group and the lease
//! deadline: the last moment the store guarantees the slot, less a margin.
//! It sends SIGTERM (and SIGCONT, so that a stopped command can act on it)
//! to the group at `deadline - grace`, and SIGKILL at `deadline`. When the
//! pipe closes without a word (consem died), it allows the group
//! `orphan_grace` at most (zero where the store frees the slot the moment
//! consem dies), SIGTERM first. It exits as soon as the group is gone, so
//! that it never outlives it, and it holds no descriptor but its pipe, so
//! that it never keeps a slot. It is not an ancestor of the command, and it
//! runs in a session of its own: the command's pid, group, terminal and
//! signals are what they were without it.
//!
//! Why a forked process rather than a pidfd, a subreaper or a cgroup: a
//! thread of consem freezes with consem; a pidfd or a subreaper still needs
//! a live, running consem to act; cgroups need privileges or systemd. A fork
//! of consem costs about 0.1 ms, and the forked process only makes system
//! calls (it runs in a copy of a multi-threaded process, where nothing else
//! is safe), so it never allocates and cannot panic.

use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::FromRawFd as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// What a 16-byte message from consem says.
const SET_GROUP: u64 = 1;
const SET_DEADLINE: u64 = 2;
const DONE: u64 = 3;

/// No deadline (the slot holds for as long as consem lives).
const NO_DEADLINE: u64 = u64::MAX;

/// How often the watchdog looks whether the group is still there.
const GROUP_CHECK_NS: u64 = 250_000_000;

#[cfg(target_os = "linux")]
const CLOCK: libc::clockid_t = libc::CLOCK_BOOTTIME;
#[cfg(not(target_os = "linux"))]
const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;

/// Nanoseconds on the clock both processes read; on Linux it goes on
/// during a suspend, so that a lease that ran out meanwhile has run out.
fn now_ns() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(CLOCK, &mut time) };
    (time.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(time.tv_nsec as u64)
}

/// A message to the watchdog: what, and its value.
fn message(what: u64, value: u64) -> [u8; 16] {
    let mut message = [0u8; 16];
    message[..8].copy_from_slice(&what.to_ne_bytes());
    message[8..].copy_from_slice(&value.to_ne_bytes());
    message
}

/// `deadline` on the watchdog's clock (`None`: while consem lives).
fn deadline_ns(deadline: Option<Instant>) -> u64 {
    match deadline {
        None => NO_DEADLINE,
        Some(deadline) => {
            let left = deadline.saturating_duration_since(Instant::now());
            now_ns().saturating_add(left.as_nanos().min(u128::from(u64::MAX)) as u64)
        }
    }
}

/// consem's end of the watchdog.
pub struct Watchdog {
    pipe: File,
    /// Waits for the watchdog to end, reaps it and says so at once: a
    /// watchdog killed by hand must be replaced before consem is killed
    /// too, not at its next look.
    reaper: thread::JoinHandle<()>,
    gone: Arc<AtomicBool>,
}

impl Watchdog {
    /// Forks the watchdog. `grace` is the time between SIGTERM and SIGKILL;
    /// `orphan_grace` what it allows the group once consem is gone;
    /// `on_end` is called once it has ended, however it did.
    pub fn start(
        grace: Duration,
        orphan_grace: Duration,
        on_end: impl FnOnce() + Send + 'static,
    ) -> io::Result<Watchdog> {
        Watchdog::fork(grace, orphan_grace, &[], on_end)
    }

    /// Forks a watchdog that guards `group`, whose lease runs until
    /// `deadline`, from its first instant: told after the fork, it would
    /// guard nothing if consem died in between.
    pub fn start_guarding(
        grace: Duration,
        orphan_grace: Duration,
        group: u32,
        deadline: Option<Instant>,
        on_end: impl FnOnce() + Send + 'static,
    ) -> io::Result<Watchdog> {
        Watchdog::fork(
            grace,
            orphan_grace,
            &[
                message(SET_GROUP, u64::from(group)),
                message(SET_DEADLINE, deadline_ns(deadline)),
            ],
            on_end,
        )
    }

    /// Forks the watchdog with `told` already in its pipe.
    fn fork(
        grace: Duration,
        orphan_grace: Duration,
        told: &[[u8; 16]],
        on_end: impl FnOnce() + Send + 'static,
    ) -> io::Result<Watchdog> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array we own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let [read_end, write_end] = fds;
        for message in told {
            // SAFETY: writes a buffer we own to the pipe we just made; a
            // few messages fit in an empty pipe, so it cannot block.
            let written = unsafe { libc::write(write_end, message.as_ptr().cast(), message.len()) };
            if written != message.len() as isize {
                let error = io::Error::last_os_error();
                // SAFETY: both descriptors are ours and open.
                unsafe {
                    libc::close(read_end);
                    libc::close(write_end);
                }
                return Err(error);
            }
        }
        let grace = grace.as_nanos().min(u128::from(u64::MAX)) as u64;
        let orphan_grace = orphan_grace.as_nanos().min(u128::from(u64::MAX)) as u64;
        // SAFETY: the child only makes system calls (see `watch`).
        match unsafe { libc::fork() } {
            -1 => {
                let error = io::Error::last_os_error();
                // SAFETY: both descriptors are ours and open.
                unsafe {
                    libc::close(read_end);
                    libc::close(write_end);
                }
                Err(error)
            }
            0 => watch(read_end, grace, orphan_grace),
            pid => {
                // SAFETY: the read end is the child's now; the write end is
                // ours alone, owned by the File from here on.
                unsafe { libc::close(read_end) };
                let pipe = unsafe { File::from_raw_fd(write_end) };
                let gone = Arc::new(AtomicBool::new(false));
                let ended = Arc::clone(&gone);
                let reaper = thread::Builder::new()
                    .name("consem-watchdog".into())
                    .spawn(move || {
                        let mut status = 0;
                        // SAFETY: waits for our own child, which only this
                        // thread reaps.
                        while unsafe { libc::waitpid(pid, &mut status, 0) } == -1
                            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
                        {
                        }
                        ended.store(true, Ordering::SeqCst);
                        on_end();
                    })?;
                Ok(Watchdog { pipe, reaper, gone })
            }
        }
    }

    fn send(&mut self, what: u64, value: u64) {
        // One write of at most PIPE_BUF bytes is atomic. A watchdog that is
        // gone (killed by hand) leaves consem to enforce the lease alone.
        let _ = self.pipe.write_all(&message(what, value));
    }

    /// The command's process group, once it runs.
    pub fn guard(&mut self, group: u32) {
        self.send(SET_GROUP, u64::from(group));
    }

    /// The lease runs until `deadline` (`None`: while consem lives).
    pub fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.send(SET_DEADLINE, deadline_ns(deadline));
    }

    /// Whether the watchdog still runs.
    pub fn alive(&self) -> bool {
        !self.gone.load(Ordering::SeqCst)
    }

    /// The command's group is gone: the watchdog exits, and is reaped.
    pub fn finish(mut self) {
        self.send(DONE, 0);
        let _ = self.reaper.join();
    }
}

/// The watchdog process. Only system calls from here on: this is a fork of
/// a multi-threaded process.
fn watch(pipe: libc::c_int, grace: u64, orphan_grace: u64) -> ! {
    // SAFETY: this process is the watchdog, and `pipe` its only descriptor
    // to keep.
    unsafe { detach(pipe) };
    let mut guard = Guard {
        group: 0,
        deadline: NO_DEADLINE,
        grace,
        termed: false,
    };
    let mut pipe_open = true;
    loop {
        let now = now_ns();
        if guard.group > 0 {
            if !group_exists(guard.group) {
                exit_now();
            }
            match guard.due(now) {
                Due::Kill => signal_group(guard.group, libc::SIGKILL),
                Due::Term => {
                    signal_group(guard.group, libc::SIGTERM);
                    signal_group(guard.group, libc::SIGCONT);
                    guard.termed = true;
                }
                Due::Nothing => {}
            }
        } else if !pipe_open {
            // consem went before the command started.
            exit_now();
        }
        match next_message(pipe_open.then_some(pipe), guard.next_look(now)) {
            Some(Message::Told(SET_GROUP, value)) => guard.group = value as libc::pid_t,
            Some(Message::Told(SET_DEADLINE, value)) => {
                guard.deadline = value;
                guard.termed = false;
            }
            Some(Message::Told(DONE, _)) => exit_now(),
            Some(Message::Told(..)) | None => {}
            Some(Message::Closed) => {
                // consem is gone without a word: the slot is about to go
                // (or has gone) with it.
                pipe_open = false;
                guard.deadline = guard.deadline.min(now.saturating_add(orphan_grace));
            }
        }
    }
}

/// What the watchdog knows of the group it guards (nanoseconds on [`CLOCK`]).
struct Guard {
    /// The command's process group; 0 until consem says.
    group: libc::pid_t,
    deadline: u64,
    grace: u64,
    /// SIGTERM was sent for the current deadline.
    termed: bool,
}

/// What the group is due at a given moment.
#[derive(Debug, PartialEq, Eq)]
enum Due {
    Kill,
    Term,
    Nothing,
}

impl Guard {
    /// SIGKILL at the deadline, SIGTERM (once) a grace before it.
    fn due(&self, now: u64) -> Due {
        if now >= self.deadline {
            Due::Kill
        } else if !self.termed && now >= self.deadline.saturating_sub(self.grace) {
            Due::Term
        } else {
            Due::Nothing
        }
    }

    /// How long to wait for consem before looking again: the group's
    /// check period, or less when the next signal is due sooner (1 ms at
    /// least); `None` (for as long as it takes) before there is a group to
    /// guard, so that a waiting consem's watchdog never wakes for nothing.
    fn next_look(&self, now: u64) -> Option<u64> {
        if self.group <= 0 {
            return None;
        }
        if now >= self.deadline {
            return Some(GROUP_CHECK_NS);
        }
        let term_at = self.deadline.saturating_sub(self.grace);
        let at = if self.termed || now >= term_at {
            self.deadline
        } else {
            term_at
        };
        Some(GROUP_CHECK_NS.min(at.saturating_sub(now).max(1_000_000)))
    }
}

/// What came from consem.
enum Message {
    /// A message: what, and its value.
    Told(u64, u64),
    /// The pipe closed: consem is gone.
    Closed,
}

/// Waits up to `within_ns` for a message on `pipe` (`None`: no pipe any
/// more, only the wait); `None` if none came.
fn next_message(pipe: Option<libc::c_int>, within_ns: Option<u64>) -> Option<Message> {
    let mut poll = libc::pollfd {
        fd: pipe.unwrap_or(-1),
        events: libc::POLLIN,
        revents: 0,
    };
    // Without a pipe something is always due (the caller exits otherwise).
    let millis = within_ns.map_or(-1, |ns| (ns / 1_000_000).max(1) as libc::c_int);
    // SAFETY: poll and read write into locals we own.
    unsafe {
        if libc::poll(&mut poll, 1, millis) <= 0 || poll.revents == 0 {
            return None;
        }
        let mut message = [0u8; 16];
        let read = libc::read(poll.fd, message.as_mut_ptr().cast(), message.len());
        if read == 16 {
            let mut what = [0u8; 8];
            let mut value = [0u8; 8];
            what.copy_from_slice(&message[..8]);
            value.copy_from_slice(&message[8..]);
            Some(Message::Told(
                u64::from_ne_bytes(what),
                u64::from_ne_bytes(value),
            ))
        } else if read == 0
            || (read < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
        {
            Some(Message::Closed)
        } else {
            None
        }
    }
}

/// True until every process of the group is gone.
fn group_exists(group: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks.
    let found = unsafe { libc::killpg(group, 0) } == 0;
    found || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

fn signal_group(group: libc::pid_t, signal: libc::c_int) {
    // SAFETY: killpg has no memory effects.
    unsafe { libc::killpg(group, signal) };
}

fn exit_now() -> ! {
    // SAFETY: ends this process without running anything of consem's.
    unsafe { libc::_exit(0) }
}

/// Leaves consem's session, signals and descriptors behind.
///
/// # Safety
/// Only in the watchdog process: async-signal-safe system calls.
unsafe fn detach(pipe: libc::c_int) {
    // A session of its own: no terminal, no job-control signals, and no
    // signal meant for consem's or the command's group.
    libc::setsid();
    // A name of its own: `killall consem` ends consem and leaves the
    // watchdog to take the command along; `ps` tells the two apart.
    #[cfg(target_os = "linux")]
    libc::prctl(libc::PR_SET_NAME, c"consem-watchdog".as_ptr());
    for signal in [
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGPIPE,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        libc::signal(signal, libc::SIG_IGN);
    }
    libc::signal(libc::SIGTERM, libc::SIG_DFL);
    let empty: libc::sigset_t = std::mem::zeroed();
    libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    close_all_but(pipe);
}

/// Closes every descriptor but `keep`: the watchdog must hold no lock file
/// of consem's (it would keep the slot) and no terminal.
unsafe fn close_all_but(keep: libc::c_int) {
    #[cfg(target_os = "linux")]
    {
        let ranges = [(0, keep - 1), (keep + 1, libc::c_int::MAX)];
        let mut closed = true;
        for (first, last) in ranges {
            if first <= last
                && libc::syscall(
                    libc::SYS_close_range,
                    first as libc::c_uint,
                    last as libc::c_uint,
                    0,
                ) != 0
            {
                closed = false;
            }
        }
        if closed {
            return;
        }
    }
    let mut limit: libc::rlimit = std::mem::zeroed();
    let highest = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
        limit.rlim_cur.min(65_536) as libc::c_int
    } else {
        1024
    };
    for fd in 0..highest {
        if fd != keep {
            libc::close(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn guard(deadline: u64, termed: bool) -> Guard {
        Guard {
            group: 42,
            deadline,
            grace: 5 * SECOND,
            termed,
        }
    }

    #[test]
    fn the_group_gets_sigterm_a_grace_before_the_deadline_and_sigkill_at_it() {
        let held = guard(100 * SECOND, false);
        assert_eq!(held.due(94 * SECOND), Due::Nothing);
        assert_eq!(held.due(95 * SECOND), Due::Term);
        assert_eq!(guard(100 * SECOND, true).due(99 * SECOND), Due::Nothing);
        assert_eq!(held.due(100 * SECOND), Due::Kill);
        // A grace longer than the time since the clock's start.
        assert_eq!(guard(SECOND, false).due(0), Due::Term);
        assert_eq!(
            guard(NO_DEADLINE, false).due(1_000_000 * SECOND),
            Due::Nothing
        );
    }

    #[test]
    fn the_watchdog_wakes_for_the_next_signal_due() {
        let held = guard(100 * SECOND, false);
        // Far off: the group's check period.
        assert_eq!(held.next_look(10 * SECOND), Some(GROUP_CHECK_NS));
        // SIGTERM due in 100 ms.
        assert_eq!(held.next_look(94_900_000_000), Some(100_000_000));
        // After SIGTERM, SIGKILL's moment; 1 ms at least.
        assert_eq!(
            guard(100 * SECOND, true).next_look(99_900_000_000),
            Some(100_000_000)
        );
        assert_eq!(
            guard(100 * SECOND, true).next_look(100 * SECOND - 1),
            Some(1_000_000)
        );
        // Past the deadline: the check period.
        assert_eq!(held.next_look(101 * SECOND), Some(GROUP_CHECK_NS));
        // No group yet (consem waits for a slot): nothing to look at
        // until consem says something.
        let unguarded = Guard {
            group: 0,
            ..guard(100 * SECOND, false)
        };
        assert_eq!(unguarded.next_look(99 * SECOND), None);
    }

    #[test]
    fn messages_carry_what_and_a_value() {
        let sent = message(SET_DEADLINE, 1234);
        assert_eq!(
            u64::from_ne_bytes(sent[..8].try_into().unwrap()),
            SET_DEADLINE
        );
        assert_eq!(u64::from_ne_bytes(sent[8..].try_into().unwrap()), 1234);
        assert_eq!(deadline_ns(None), NO_DEADLINE);
    }
}
