//! The few Unix calls the standard library does not wrap: process groups,
//! the parent-death signal, and handing the terminal to the child. Each
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

/// Makes `group` the terminal's foreground group. A background process that
/// does this gets SIGTTOU, so it is blocked for the call.
pub fn give_terminal_to(group: u32) {
    let Ok(group) = libc::pid_t::try_from(group) else {
        return;
    };
    with_sigttou_blocked(|| {
        // SAFETY: tcsetpgrp on fd 0; failure (no terminal) is harmless.
        unsafe { libc::tcsetpgrp(0, group) };
    });
}

/// Takes the terminal back for consem's own group after the child ends.
pub fn take_terminal_back() {
    // SAFETY: getpgrp cannot fail.
    let ours = unsafe { libc::getpgrp() };
    with_sigttou_blocked(|| {
        // SAFETY: as in give_terminal_to.
        unsafe { libc::tcsetpgrp(0, ours) };
    });
}

fn with_sigttou_blocked(f: impl FnOnce()) {
    // SAFETY: the sigset is initialised by sigemptyset before use, and the
    // old mask is restored on this same thread.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
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
            // SAFETY: as in with_sigttou_blocked, on the child's only thread.
            unsafe {
                let mut block: libc::sigset_t = std::mem::zeroed();
                let mut old: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut block);
                libc::sigaddset(&mut block, libc::SIGTTOU);
                libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old);
                libc::tcsetpgrp(0, libc::getpid());
                libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            }
        }
        Ok(())
    };
    // SAFETY: the closure makes only async-signal-safe calls and allocates
    // nothing.
    unsafe { command.pre_exec(setup) };
}
