//! The few Unix calls the standard library does not wrap: process groups,
//! the parent-death signal, handing the terminal to the child, and waiting
//! for the child to stop as well as to end. Each
//! `unsafe` block is one libc call with its reason.

use std::os::unix::process::CommandExt as _;
use std::process::Command;

/// This machine's name, for the contender key's description.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Sends `signal` to every process in the group `group`. False if the group
/// is gone.
pub fn signal_group(group: u32, signal: i32) -> bool {
    let Ok(group) = libc::pid_t::try_from(group) else {
        return false;
    };
    // SAFETY: killpg has no memory effects; a stale group answers ESRCH.
    unsafe { libc::killpg(group, signal) == 0 }
}

/// True if standard input is a terminal whose foreground process group is
/// ours: only then may the child take the terminal over.
pub fn we_own_the_terminal() -> bool {
    // SAFETY: plain queries on fd 0 and on our own process.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Makes `group` the terminal's foreground group. (A background process
/// doing this would get SIGTTOU; consem ignores it, see
/// `set_signal_dispositions`.)
pub fn give_terminal_to(group: u32) {
    let Ok(group) = libc::pid_t::try_from(group) else {
        return;
    };
    // SAFETY: tcsetpgrp on fd 0; failure (no terminal) is harmless.
    unsafe { libc::tcsetpgrp(0, group) };
}

/// Takes the terminal back for consem's own group after the child ends or
/// stops.
pub fn take_terminal_back() {
    // SAFETY: getpgrp cannot fail; tcsetpgrp as above.
    unsafe { libc::tcsetpgrp(0, libc::getpgrp()) };
}

/// Sets the child up to run in a process group of its own (so that stopping
/// it reaches everything it starts), to die with consem on Linux (parent-death
/// signal), and, if asked, to take the terminal as its foreground group.
pub fn prepare_child(command: &mut Command, take_terminal: bool) {
    command.process_group(0);
    // SAFETY: getpid cannot fail.
    let parent = unsafe { libc::getpid() };
    let setup = move || -> std::io::Result<()> {
        // Only async-signal-safe calls here: we are between fork and exec.
        #[cfg(target_os = "linux")]
        // SAFETY: prctl and getppid/raise take no pointers.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // consem may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::raise(libc::SIGKILL);
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = parent;
        if take_terminal {
            // SAFETY: tcsetpgrp and getpid take no pointers; SIGTTOU is still
            // ignored here (inherited from consem), so this cannot stop us.
            unsafe { libc::tcsetpgrp(0, libc::getpid()) };
        }
        // SAFETY: signal is async-signal-safe. consem ignores SIGTTOU; the
        // command gets the usual job control.
        unsafe { libc::signal(libc::SIGTTOU, libc::SIG_DFL) };
        Ok(())
    };
    // SAFETY: the closure makes only async-signal-safe calls and allocates
    // nothing.
    unsafe { command.pre_exec(setup) };
}

/// How the child changed, as `waitpid` with `WUNTRACED` reports it.
pub enum ChildChange {
    /// Stopped by this signal (job control, or SIGSTOP).
    Stopped(i32),
    Ended(std::process::ExitStatus),
}

/// Waits for the child `pid` to stop or end.
pub fn wait_child(pid: u32) -> std::io::Result<ChildChange> {
    use std::os::unix::process::ExitStatusExt as _;
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into our local integer.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
        if rc == pid {
            return Ok(if libc::WIFSTOPPED(status) {
                ChildChange::Stopped(libc::WSTOPSIG(status))
            } else {
                ChildChange::Ended(std::process::ExitStatus::from_raw(status))
            });
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// True if stderr is a terminal whose foreground group is ours: a consem in
/// the background must not draw over what the user types.
pub fn stderr_in_foreground() -> bool {
    // SAFETY: plain queries on fd 2 and on our own process.
    unsafe { libc::isatty(2) == 1 && libc::tcgetpgrp(2) == libc::getpgrp() }
}

/// Whether the process `pid` is stopped right now, from /proc (Linux).
/// Elsewhere this cannot be told and is false: stop reports alone count.
pub fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // "pid (comm) T ...": the state follows the last ')'.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

/// Stops consem itself until a SIGCONT, as a shell's job-control expects of
/// a job whose command stopped. Returns once continued.
pub fn stop_self() {
    // SAFETY: raise has no memory effects; SIGSTOP stops the whole process.
    unsafe { libc::raise(libc::SIGSTOP) };
}

/// Dispositions consem needs whatever its parent left it: SIGCHLD at its
/// default, so that the child is not reaped behind consem's back; SIGTTOU
/// ignored, so that writing to stderr or taking the terminal back while the
/// child owns the terminal never stops consem. The child gets SIGTTOU's
/// default back before exec (see `prepare_child`).
pub fn set_signal_dispositions() {
    // SAFETY: plain disposition changes at start-up, before other threads.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
    }
}
