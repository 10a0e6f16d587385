//! A pseudo-terminal for tests that need consem on a terminal: the process
//! under test runs as the session leader of a new terminal, as a login shell
//! would, and the test types on the master side and reads what is shown.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};

use super::wait_until;
use super::world::PROMPT;

/// A pseudo-terminal pair from posix_openpt; both ends close-on-exec.
pub struct Pty {
    pub master: File,
    pub slave: File,
}

pub fn open_pty() -> std::io::Result<Pty> {
    use std::os::fd::FromRawFd as _;
    let os_error = std::io::Error::last_os_error;
    // SAFETY: each call is checked; the fds are owned by the Files built from
    // them; ptsname_r writes a NUL-terminated name within the buffer's length.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(os_error());
        }
        let master = File::from_raw_fd(fd);
        if libc::grantpt(fd) != 0 || libc::unlockpt(fd) != 0 {
            return Err(os_error());
        }
        let mut name = [0 as libc::c_char; 256];
        let rc = libc::ptsname_r(fd, name.as_mut_ptr(), name.len());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        let slave = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if slave < 0 {
            return Err(os_error());
        }
        Ok(Pty {
            master,
            slave: File::from_raw_fd(slave),
        })
    }
}

/// Everything the terminal shows, collected by a reader thread until every
/// slave end is closed.
#[derive(Clone, Default)]
pub struct Screen(Arc<Mutex<Vec<u8>>>);

impl Screen {
    pub fn follow(mut master: File) -> Screen {
        let screen = Screen::default();
        let shown = screen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once the last slave end closes: the terminal is gone.
            while let Ok(n @ 1..) = master.read(&mut buf) {
                shown.0.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        screen
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    pub fn wait_for(&self, what: &str) {
        wait_until(PROMPT, &format!("{what:?} on the terminal"), || {
            self.text().contains(what)
        });
    }
}

/// The master side of a terminal whose session leader a test started: what
/// it shows, and a keyboard.
pub struct Terminal {
    pub screen: Screen,
    keyboard: File,
}

impl Terminal {
    /// Types `keys` (`\x03` is Ctrl-C, `\x1a` Ctrl-Z).
    pub fn type_in(&mut self, keys: &[u8]) {
        self.keyboard.write_all(keys).unwrap();
    }

    /// Sets the window's size, as a terminal emulator does when its window
    /// is resized: the foreground group gets SIGWINCH.
    pub fn resize(&mut self, columns: u16, rows: u16) {
        let size = libc::winsize {
            ws_row: rows,
            ws_col: columns,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads the winsize we pass.
        let rc = unsafe { libc::ioctl(self.keyboard.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
    }

    /// The terminal's foreground process group (Linux answers TIOCGPGRP on
    /// the master side); 0 if that group no longer exists.
    pub fn foreground_group(&self) -> i32 {
        // SAFETY: tcgetpgrp on an fd we own; it takes no pointers.
        let group = unsafe { libc::tcgetpgrp(self.keyboard.as_raw_fd()) };
        assert!(
            group >= 0,
            "tcgetpgrp on the master: {}",
            std::io::Error::last_os_error()
        );
        group
    }
}

/// Starts `command` as the session leader of a new pseudo-terminal, with the
/// terminal as its stdin, stdout, stderr and controlling terminal (its process
/// group in the foreground). Only the process and its descendants keep the
/// slave side open, so the screen ends when they are gone. Err if no
/// pseudo-terminal can be opened (the caller skips its test).
pub fn spawn_on_terminal(mut command: Command) -> std::io::Result<(Child, Terminal)> {
    let pty = open_pty()?;
    let size = libc::winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads the winsize we pass. An 80x24 window, as a
    // terminal emulator opens by default.
    if unsafe { libc::ioctl(pty.master.as_raw_fd(), libc::TIOCSWINSZ, &size) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    command
        .stdin(pty.slave.try_clone().unwrap())
        .stdout(pty.slave.try_clone().unwrap())
        .stderr(pty.slave.try_clone().unwrap());
    // SAFETY: setsid and ioctl are async-signal-safe and take no pointers
    // that outlive the call; fd 0 is the slave by now.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().unwrap();
    // Only the child keeps the terminal open from here on.
    drop(command);
    drop(pty.slave);
    let screen = Screen::follow(pty.master.try_clone().unwrap());
    Ok((
        child,
        Terminal {
            screen,
            keyboard: pty.master,
        },
    ))
}
