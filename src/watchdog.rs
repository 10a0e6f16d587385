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
    // SAFETY (whole function): async-signal-safe system calls on values
    // this process owns.
    unsafe {
        // A session of its own: no terminal, no job-control signals, and
        // no signal meant for consem's or the command's group.
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

        let mut group: libc::pid_t = 0;
        let mut deadline = NO_DEADLINE;
        let mut termed = false;
        let mut pipe_open = true;
        loop {
            let now = now_ns();
            if group > 0 {
                if libc::killpg(group, 0) != 0
                    && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
                {
                    libc::_exit(0);
                }
                if now >= deadline {
                    libc::killpg(group, libc::SIGKILL);
                } else if !termed && now >= deadline.saturating_sub(grace) {
                    libc::killpg(group, libc::SIGTERM);
                    libc::killpg(group, libc::SIGCONT);
                    termed = true;
                }
            } else if !pipe_open {
                // consem went before the command started.
                libc::_exit(0);
            }
            let mut next = GROUP_CHECK_NS;
            if group > 0 && now < deadline {
                let term_at = deadline.saturating_sub(grace);
                let at = if termed || now >= term_at {
                    deadline
                } else {
                    term_at
                };
                next = next.min(at.saturating_sub(now).max(1_000_000));
            }
            let mut poll = libc::pollfd {
                fd: if pipe_open { pipe } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            };
            let millis = (next / 1_000_000).max(1) as libc::c_int;
            if libc::poll(&mut poll, 1, millis) <= 0 || poll.revents == 0 {
                continue;
            }
            let mut message = [0u8; 16];
            let read = libc::read(pipe, message.as_mut_ptr().cast(), message.len());
            if read == 16 {
                let mut what = [0u8; 8];
                let mut value = [0u8; 8];
                what.copy_from_slice(&message[..8]);
                value.copy_from_slice(&message[8..]);
                let value = u64::from_ne_bytes(value);
                match u64::from_ne_bytes(what) {
                    SET_GROUP => group = value as libc::pid_t,
                    SET_DEADLINE => {
                        deadline = value;
                        termed = false;
                    }
                    DONE => libc::_exit(0),
                    _ => {}
                }
            } else if read == 0
                || (read < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
            {
                // consem is gone without a word: the slot is about to go
                // (or has gone) with it.
                pipe_open = false;
                deadline = deadline.min(now.saturating_add(orphan_grace));
            }
        }
    }
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
