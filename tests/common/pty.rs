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

/// Everything the terminal was sent, collected by a reader thread until
/// every slave end is closed, and what a terminal emulator shows of it.
#[derive(Clone)]
pub struct Screen(Arc<Mutex<Shown>>);

struct Shown {
    bytes: Vec<u8>,
    /// Every slave end is closed: nothing more will come.
    closed: bool,
    /// An xterm-like emulator (it cuts lines when the window narrows, it
    /// does not reflow them), as big as the window.
    emulator: vt100::Parser,
}

impl Screen {
    fn follow(mut master: File, rows: u16, columns: u16) -> Screen {
        let screen = Screen(Arc::new(Mutex::new(Shown {
            bytes: Vec::new(),
            closed: false,
            emulator: vt100::Parser::new(nonzero(rows), nonzero(columns), 0),
        })));
        let shown = screen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once the last slave end closes: the terminal is gone.
            while let Ok(n @ 1..) = master.read(&mut buf) {
                let mut shown = shown.0.lock().unwrap();
                shown.bytes.extend_from_slice(&buf[..n]);
                shown.emulator.process(&buf[..n]);
            }
            shown.0.lock().unwrap().closed = true;
        });
        screen
    }

    /// What was sent, escape sequences and all.
    pub fn text(&self) -> String {
        self.text_since(0)
    }

    /// How many bytes were sent so far: a mark for [`Screen::text_since`].
    pub fn sent(&self) -> usize {
        self.0.lock().unwrap().bytes.len()
    }

    /// What was sent after `mark`.
    pub fn text_since(&self, mark: usize) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap().bytes[mark..]).into_owned()
    }

    pub fn wait_for(&self, what: &str) {
        wait_until(PROMPT, &format!("{what:?} on the terminal"), || {
            self.text().contains(what)
        });
    }

    /// Waits until every process that had the terminal open is gone and
    /// all they wrote is shown.
    pub fn wait_closed(&self) {
        wait_until(PROMPT, "the terminal to be closed", || {
            self.0.lock().unwrap().closed
        });
    }

    /// The window's rows as shown now, trailing blanks cut.
    pub fn rows(&self) -> Vec<String> {
        let shown = self.0.lock().unwrap();
        let screen = shown.emulator.screen();
        let (_, columns) = screen.size();
        screen
            .rows(0, columns.get())
            .map(|row| row.trim_end().to_string())
            .collect()
    }

    /// The cursor's row and column, from 0.
    pub fn cursor(&self) -> (u16, u16) {
        self.0.lock().unwrap().emulator.screen().cursor_position()
    }
}

fn nonzero(n: u16) -> std::num::NonZeroU16 {
    std::num::NonZeroU16::new(n).expect("a window is at least one row and column")
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
        // As an emulator does: its window takes the new size first, so
        // that whatever arrives after is shown at that size.
        let mut shown = self.screen.0.lock().unwrap();
        shown.emulator.set_size(nonzero(rows), nonzero(columns));
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
pub fn spawn_on_terminal(command: Command) -> std::io::Result<(Child, Terminal)> {
    // An 80x24 window, as a terminal emulator opens by default.
    spawn_on_terminal_sized(command, 80, 24)
}

/// [`spawn_on_terminal`], in a window of `columns` and `rows`.
pub fn spawn_on_terminal_sized(
    mut command: Command,
    columns: u16,
    rows: u16,
) -> std::io::Result<(Child, Terminal)> {
    let pty = open_pty()?;
    let size = libc::winsize {
        ws_row: rows,
        ws_col: columns,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads the winsize we pass.
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
    let screen = Screen::follow(pty.master.try_clone().unwrap(), size.ws_row, size.ws_col);
    Ok((
        child,
        Terminal {
            screen,
            keyboard: pty.master,
        },
    ))
}
