//! The few Unix calls the standard library does not wrap: starting the child
//! without copying consem's memory, in its own process group and with the
//! parent-death signal; handing it the terminal; and waiting for it to stop
//! as well as to end. Each `unsafe` block gives its reason.

use std::ffi::OsString;
use std::io;

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

/// True while any process of the group `group` exists.
pub fn group_exists(group: u32) -> bool {
    let Ok(group) = libc::pid_t::try_from(group) else {
        return false;
    };
    // SAFETY: signal 0 only checks; no memory is touched.
    let found = unsafe { libc::killpg(group, 0) } == 0;
    // EPERM: there, but not ours to signal (a member that changed user).
    found || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The descriptor of consem's terminal: the first of stdin, stdout and
/// stderr that is one (`seq | consem -- less` has it on stdout only).
pub fn terminal() -> Option<i32> {
    // SAFETY: isatty only queries the descriptor.
    (0..3).find(|&fd| unsafe { libc::isatty(fd) } == 1)
}

/// True if consem's process group is its terminal's foreground group.
pub fn we_own_the_terminal() -> bool {
    // SAFETY: plain queries on a descriptor and on our own process.
    terminal().is_some_and(|fd| unsafe { libc::tcgetpgrp(fd) == libc::getpgrp() })
}

/// True if consem is a job of its own: it leads its process group and no
/// other process is in it. A shell with job control makes each job such a
/// group; a pipeline's members, or a script run without job control,
/// share one with consem.
pub fn alone_in_group() -> bool {
    // SAFETY: getpid and getpgrp cannot fail.
    let (pid, group) = unsafe { (libc::getpid(), libc::getpgrp()) };
    if pid != group {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    !entries.flatten().any(|entry| {
        let name = entry.file_name();
        let Some(other) = name.to_str().and_then(|n| n.parse::<libc::pid_t>().ok()) else {
            return false;
        };
        other != pid
            && std::fs::read_to_string(format!("/proc/{other}/stat")).is_ok_and(|stat| {
                // "pid (comm) state ppid pgrp ...": fields after the last ')'.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(2))
                    .and_then(|pgrp| pgrp.parse::<libc::pid_t>().ok())
                    == Some(group)
            })
    })
}

/// Makes `group` the terminal's foreground group. (A background process
/// doing this would get SIGTTOU; consem ignores it, see
/// `set_signal_dispositions`.)
pub fn give_terminal_to(group: u32) {
    let (Ok(group), Some(fd)) = (libc::pid_t::try_from(group), terminal()) else {
        return;
    };
    // SAFETY: tcsetpgrp on our terminal; failure is harmless.
    unsafe { libc::tcsetpgrp(fd, group) };
}

/// Takes the terminal back for consem's own group after the child ends or
/// stops.
pub fn take_terminal_back() {
    if let Some(fd) = terminal() {
        // SAFETY: getpgrp cannot fail; tcsetpgrp as above.
        unsafe { libc::tcsetpgrp(fd, libc::getpgrp()) };
    }
}

/// The standard descriptors (bit 0: stdin, 1: stdout, 2: stderr) that were
/// closed when consem started. Rust's runtime opens /dev/null on them before
/// `main`, so they are read before it, by a constructor; the command gets
/// them closed again, as it would without consem.
static CLOSED_AT_START: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static RECORD_CLOSED_STANDARD_FDS: extern "C" fn() = record_closed_standard_fds;

#[cfg(target_os = "linux")]
extern "C" fn record_closed_standard_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only asks whether the descriptor is open.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            CLOSED_AT_START.fetch_or(1 << fd, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// A random UUID (version 4, RFC 9562's form), from the kernel's random
/// source (a time- and pid-based value where it cannot be read): the ids
/// of a contender's records.
pub fn random_uuid() -> String {
    let mut bytes = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_err()
    {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            ^ u128::from(std::process::id());
        bytes = seed.to_le_bytes();
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Why a command cannot run.
#[derive(Debug)]
pub enum NotRunnable {
    /// As `execvp` reports it: `NotFound` for no such file,
    /// `PermissionDenied` for one that cannot be executed (a directory, no
    /// execute permission).
    Program(io::Error),
    /// A script whose `#!` line names an interpreter that cannot run.
    Interpreter {
        interpreter: String,
        error: io::Error,
    },
}

/// Finds the command as `execvp` would (a name with a `/` as it is, else
/// in each directory of `path`, `/bin:/usr/bin` without one), and a
/// script's interpreter (its `#!` line), so that a command that cannot run
/// is refused before any slot is asked for: a cron line must not wait
/// hours for a typo.
pub fn find_program(
    program: &std::ffi::OsStr,
    path: Option<&std::ffi::OsStr>,
) -> Result<(), NotRunnable> {
    let found = find_file(program, path).map_err(NotRunnable::Program)?;
    match interpreter_of(&found) {
        Some(interpreter) => find_file(std::ffi::OsStr::new(&interpreter), None)
            .map(drop)
            .map_err(|error| NotRunnable::Interpreter { interpreter, error }),
        None => Ok(()),
    }
}

/// The interpreter a script's `#!` line names (a path, as the kernel
/// takes it), if the file starts with one.
fn interpreter_of(file: &std::path::Path) -> Option<String> {
    use std::io::Read as _;
    let mut head = [0u8; 256];
    let read = std::fs::File::open(file).ok()?.read(&mut head).ok()?;
    let line = head[..read].strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n')?];
    let interpreter = String::from_utf8_lossy(line)
        .split_whitespace()
        .next()?
        .to_string();
    // A name without a `/` is not looked up in PATH by the kernel; leave
    // it to the kernel to refuse.
    interpreter.starts_with('/').then_some(interpreter)
}

/// The file `program` names, found as `execvp` finds it.
fn find_file(
    program: &std::ffi::OsStr,
    path: Option<&std::ffi::OsStr>,
) -> io::Result<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt as _;
    let runnable = |candidate: &std::path::Path| -> io::Result<()> {
        let metadata = std::fs::metadata(candidate)?;
        let c_path = std::ffi::CString::new(candidate.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))?;
        // SAFETY: a valid NUL-terminated path.
        let executable = unsafe { libc::access(c_path.as_ptr(), libc::X_OK) } == 0;
        if metadata.is_file() && executable {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::EACCES))
        }
    };
    if program.as_bytes().contains(&b'/') {
        let file = std::path::Path::new(program);
        return runnable(file).map(|()| file.to_path_buf());
    }
    if program.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    let path = path.unwrap_or(std::ffi::OsStr::new("/bin:/usr/bin"));
    let mut denied = false;
    for dir in path.as_bytes().split(|b| *b == b':') {
        // An empty entry is the current directory.
        let dir = if dir.is_empty() { b".".as_slice() } else { dir };
        let candidate = std::path::Path::new(std::ffi::OsStr::from_bytes(dir)).join(program);
        match runnable(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => denied = true,
            Err(_) => {}
        }
    }
    Err(io::Error::from_raw_os_error(if denied {
        libc::EACCES
    } else {
        libc::ENOENT
    }))
}

/// Starts the command: `argv[0]` is looked up in PATH as `execvp` does, and
/// `env` is added to consem's environment. The child runs in a process group
/// of its own (so that stopping it reaches everything it starts), dies with
/// consem on Linux (parent-death signal), and, if asked, takes the terminal
/// as its foreground group. Returns its pid.
#[cfg(target_os = "linux")]
pub fn spawn_child(
    argv: &[OsString],
    env: &[(String, String)],
    terminal: Option<i32>,
) -> io::Result<u32> {
    use std::os::unix::ffi::OsStrExt as _;
    use std::sync::atomic::{AtomicI32, Ordering};

    let args = vfork::c_strings(argv.iter().map(|arg| arg.as_bytes().to_vec()))?;
    let vars = vfork::c_strings(vfork::environment(env))?;
    let mut setup = vfork::Setup {
        file: args[0].as_ptr(),
        argv: vfork::null_terminated(&args),
        envp: vfork::null_terminated(&vars),
        // SAFETY: getpid cannot fail.
        parent: unsafe { libc::getpid() },
        terminal: terminal.unwrap_or(-1),
        closed: CLOSED_AT_START.load(Ordering::Relaxed),
        last_signal: libc::SIGRTMAX(),
        // SAFETY: a sigset_t is plain data; pthread_sigmask fills it.
        mask: unsafe { std::mem::zeroed() },
        error: AtomicI32::new(0),
    };
    let pid = vfork::clone_and_exec(&mut setup, args.len())?;
    match setup.error.load(Ordering::Relaxed) {
        0 => Ok(pid),
        errno => {
            // The child exited without exec: reap it.
            let _ = wait_child(pid);
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// Linux: the child is started as glibc's `posix_spawn` starts it, a
/// `clone(CLONE_VM | CLONE_VFORK)` that shares consem's memory until exec
/// (a fork would copy consem's page tables only for exec to throw them
/// away, which costs about half a millisecond).
#[cfg(target_os = "linux")]
mod vfork {
    use std::ffi::CString;
    use std::io;
    use std::sync::atomic::{AtomicI32, Ordering};

    /// What the child needs, prepared by the parent: it must not allocate.
    pub struct Setup {
        pub file: *const libc::c_char,
        pub argv: Vec<*const libc::c_char>,
        pub envp: Vec<*const libc::c_char>,
        pub parent: libc::pid_t,
        /// The terminal to take as the foreground group, if any.
        pub terminal: libc::c_int,
        /// Standard descriptors consem's parent left closed (bit per fd).
        pub closed: u8,
        pub last_signal: libc::c_int,
        /// The signal mask to run the command with: consem's own.
        pub mask: libc::sigset_t,
        /// errno of the step that failed, 0 if exec succeeded.
        pub error: AtomicI32,
    }

    pub fn c_strings(strings: impl Iterator<Item = Vec<u8>>) -> io::Result<Vec<CString>> {
        strings
            .map(|bytes| {
                CString::new(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
            })
            .collect()
    }

    /// consem's environment with `env` in place of the variables it names.
    pub fn environment(env: &[(String, String)]) -> impl Iterator<Item = Vec<u8>> + '_ {
        use std::os::unix::ffi::OsStrExt as _;
        std::env::vars_os()
            .filter(|(name, _)| !env.iter().any(|(ours, _)| name == ours.as_str()))
            .map(|(name, value)| [name.as_bytes(), b"=", value.as_bytes()].concat())
            .chain(
                env.iter()
                    .map(|(name, value)| format!("{name}={value}").into_bytes()),
            )
    }

    pub fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
        let mut pointers: Vec<_> = strings.iter().map(|s| s.as_ptr()).collect();
        pointers.push(std::ptr::null());
        pointers
    }

    /// Starts the child with every signal blocked in this thread (so that
    /// none reaches it before it resets the handlers), and returns once it
    /// has exec'd or exited: its pid.
    pub fn clone_and_exec(setup: &mut Setup, argc: usize) -> io::Result<u32> {
        // The child's stack, sized as glibc's posix_spawn sizes it: execvp
        // may copy argv onto it (a script without #!) next to a path buffer.
        let mut stack = Vec::<u8>::with_capacity(64 * 1024 + argc * size_of::<usize>());
        let top = (stack.as_mut_ptr() as usize + stack.capacity()) & !15;
        // SAFETY: fills a local sigset_t and saves this thread's mask.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut setup.mask);
        }
        // SAFETY: CLONE_VM | CLONE_VFORK: the child shares this memory and
        // this thread waits until it has exec'd or exited, so `setup` and
        // `stack` outlive its use of them.
        let pid = unsafe {
            libc::clone(
                child,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                std::ptr::addr_of_mut!(*setup).cast(),
            )
        };
        let clone_error = io::Error::last_os_error();
        // SAFETY: restores this thread's own mask, saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &setup.mask, std::ptr::null_mut()) };
        if pid < 0 {
            return Err(clone_error);
        }
        Ok(pid.unsigned_abs())
    }

    /// Runs in the child, in consem's memory, while the spawning thread
    /// waits (vfork): only async-signal-safe calls, and none that use the
    /// thread's identity (`raise` would signal consem's thread).
    extern "C" fn child(setup: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `setup` points to the Setup that spawn_child keeps alive
        // until the child has exec'd or exited.
        let setup = unsafe { &*setup.cast::<Setup>() };
        // SAFETY: each call takes plain values or pointers into `setup`, or
        // into this stack frame.
        unsafe {
            if libc::setpgid(0, 0) == 0 {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // consem may have died before prctl took effect.
                if libc::getppid() != setup.parent {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
                if setup.terminal >= 0 {
                    // SIGTTOU is still ignored here (inherited from consem),
                    // so this cannot stop us.
                    libc::tcsetpgrp(setup.terminal, libc::getpid());
                }
                default_signal_actions(setup.last_signal);
                for fd in 0..3 {
                    if setup.closed & (1 << fd) != 0 {
                        libc::close(fd);
                    }
                }
                libc::pthread_sigmask(libc::SIG_SETMASK, &setup.mask, std::ptr::null_mut());
                libc::execvpe(setup.file, setup.argv.as_ptr(), setup.envp.as_ptr());
            }
            let errno = io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL);
            setup.error.store(errno, Ordering::Relaxed);
            libc::_exit(127)
        }
    }

    /// A handler would run in the child, in consem's memory: back to the
    /// defaults before signals are let in. consem ignores SIGPIPE (Rust's
    /// runtime) and SIGTTOU; the command gets the usual. Other ignored
    /// signals were left so by consem's parent, and stay ignored.
    ///
    /// # Safety
    /// Only in the child, before exec (sigaction and signal are
    /// async-signal-safe).
    unsafe fn default_signal_actions(last_signal: libc::c_int) {
        for signal in 1..=last_signal {
            let mut action: libc::sigaction = std::mem::zeroed();
            let handled = libc::sigaction(signal, std::ptr::null(), &mut action) == 0
                && action.sa_sigaction != libc::SIG_DFL
                && (action.sa_sigaction != libc::SIG_IGN
                    || signal == libc::SIGPIPE
                    || signal == libc::SIGTTOU);
            if handled {
                // Ignoring first discards one that is pending (a Ctrl-Z
                // meant for consem would otherwise stop the child before
                // exec, with consem stuck in clone); consem got it too and
                // forwards it.
                libc::signal(signal, libc::SIG_IGN);
                libc::signal(signal, libc::SIG_DFL);
            }
        }
    }
}

/// Starts the command as the Linux version does, without the parent-death
/// signal, which other systems do not have.
#[cfg(not(target_os = "linux"))]
pub fn spawn_child(
    argv: &[OsString],
    env: &[(String, String)],
    terminal: Option<i32>,
) -> io::Result<u32> {
    use std::os::unix::process::CommandExt as _;
    let mut command = std::process::Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .envs(env.iter().cloned())
        .process_group(0);
    let setup = move || -> io::Result<()> {
        if let Some(fd) = terminal {
            // SAFETY: tcsetpgrp and getpid take no pointers; SIGTTOU is still
            // ignored here (inherited from consem), so this cannot stop us.
            unsafe { libc::tcsetpgrp(fd, libc::getpid()) };
        }
        // SAFETY: signal is async-signal-safe. consem ignores SIGTTOU; the
        // command gets the usual job control.
        unsafe { libc::signal(libc::SIGTTOU, libc::SIG_DFL) };
        Ok(())
    };
    // SAFETY: the closure makes only async-signal-safe calls and allocates
    // nothing.
    unsafe { command.pre_exec(setup) };
    command.spawn().map(|child| child.id())
}

/// How the child changed, as `waitpid` with `WUNTRACED` reports it.
pub enum ChildChange {
    /// Stopped by this signal (job control, or SIGSTOP).
    Stopped(i32),
    Ended(std::process::ExitStatus),
}

/// Waits for the child `pid` to stop or end.
pub fn wait_child(pid: u32) -> io::Result<ChildChange> {
    use std::os::unix::process::ExitStatusExt as _;
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
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
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
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

/// The width, in columns, of the terminal on stderr; `None` if it has none
/// or does not say.
pub fn stderr_columns() -> Option<usize> {
    // SAFETY: TIOCGWINSZ writes a winsize into our local struct.
    unsafe {
        let mut size: libc::winsize = std::mem::zeroed();
        (libc::ioctl(2, libc::TIOCGWINSZ, &mut size) == 0 && size.ws_col > 0)
            .then_some(usize::from(size.ws_col))
    }
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
/// default back before exec (see `spawn_child`).
pub fn set_signal_dispositions() {
    // SAFETY: plain disposition changes at start-up, before other threads.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
    }
}

/// The signals among `signals` that consem's parent left ignored (`nohup`,
/// a shell's background job, `trap ''`): consem leaves them ignored, for
/// itself and so for the command, as Unix tools do.
pub fn ignored_at_start(signals: &[i32]) -> Vec<i32> {
    signals
        .iter()
        .copied()
        .filter(|&signal| {
            // SAFETY: sigaction with a null new action only reads the
            // current one into our local struct.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                libc::sigaction(signal, std::ptr::null(), &mut action) == 0
                    && action.sa_sigaction == libc::SIG_IGN
            }
        })
        .collect()
}

/// Ends consem by `signal`, once it has cleaned up, so that its parent
/// sees what ended the run (a shell stops a loop at Ctrl-C only for a child
/// killed by SIGINT). No core file is written for it. A signal whose
/// default is not to end a process ends it with the shell's number.
pub fn die_of(signal: i32) -> ! {
    // SAFETY: setrlimit, signal, the mask and raise take plain values or
    // pointers to locals; raise signals only this thread.
    unsafe {
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(signal, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(signal);
    }
    std::process::exit(128 + signal)
}

/// For the commands whose output is read by a pipeline (`status`,
/// `completions`): a reader that went away (`| head`, `| true`) ends consem
/// by SIGPIPE, as it ends `cat`, instead of a panic on a failed print.
/// Not for `run`, which must outlive its stderr to stop its command.
pub fn die_of_a_closed_pipe() {
    // SAFETY: signal takes no pointers; no other thread runs yet.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_program_is_found_as_execvp_finds_it() {
        let dir = std::env::temp_dir().join(format!("consem-find-{}", std::process::id()));
        let (first, second) = (dir.join("first"), dir.join("second"));
        std::fs::create_dir_all(&first).unwrap();
        std::fs::create_dir_all(&second).unwrap();
        let write = |path: &std::path::Path, mode: u32| {
            std::fs::write(path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(&first.join("job"), 0o644);
        write(&second.join("job"), 0o755);
        write(&first.join("plain"), 0o644);
        let path = std::ffi::OsString::from(format!("{}:{}", first.display(), second.display()));
        let find = |name: &str| match find_program(std::ffi::OsStr::new(name), Some(&path)) {
            Ok(()) => Ok(()),
            Err(NotRunnable::Program(error)) => Err(error.kind()),
            Err(NotRunnable::Interpreter { interpreter, .. }) => panic!("{name}: {interpreter}"),
        };
        // Not executable in the first directory: found in the second.
        assert_eq!(find("job"), Ok(()));
        // Only a file that cannot be run: 126's error; none at all: 127's.
        assert_eq!(find("plain"), Err(io::ErrorKind::PermissionDenied));
        assert_eq!(find("nosuch"), Err(io::ErrorKind::NotFound));
        assert_eq!(find(""), Err(io::ErrorKind::NotFound));
        // A path is taken as it is: a directory cannot be run.
        assert_eq!(
            find(first.to_str().unwrap()),
            Err(io::ErrorKind::PermissionDenied)
        );
        assert_eq!(find(second.join("job").to_str().unwrap()), Ok(()));
        assert_eq!(find("/nonexistent/job"), Err(io::ErrorKind::NotFound));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_random_uuid_is_version_4_and_differs_each_time() {
        let uuid = random_uuid();
        assert_eq!(uuid.len(), 36);
        assert_eq!(uuid.matches('-').count(), 4);
        assert_eq!(&uuid[14..15], "4");
        assert!("89ab".contains(&uuid[19..20]), "{uuid}");
        assert_ne!(uuid, random_uuid());
    }

    #[test]
    fn a_script_whose_interpreter_cannot_run_is_refused_naming_it() {
        let dir = std::env::temp_dir().join(format!("consem-shebang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            path.into_os_string()
        };
        let missing = script("missing", "#!/nonexistent/sh -e\necho\n");
        match find_program(&missing, None) {
            Err(NotRunnable::Interpreter { interpreter, error }) => {
                assert_eq!(interpreter, "/nonexistent/sh");
                assert_eq!(error.kind(), io::ErrorKind::NotFound);
            }
            other => panic!("{other:?}"),
        }
        let not_executable = script("plain", &format!("#!{}\n", dir.join("missing").display()));
        std::fs::set_permissions(dir.join("missing"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        assert!(matches!(
            find_program(&not_executable, None),
            Err(NotRunnable::Interpreter { error, .. }) if error.kind() == io::ErrorKind::PermissionDenied
        ));
        assert!(find_program(&script("sh", "#! /bin/sh\necho\n"), None).is_ok());
        assert!(find_program(&script("env", "#!/usr/bin/env bash\n"), None).is_ok());
        // No line end within the first bytes, or no #!: the kernel's call.
        assert!(find_program(&script("binary", "\x7fELF"), None).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
