//! How consem exits: its own codes (see `cli::EXIT_CODES`), and the one
//! map from how a run ended (an outcome, or an error of the store or of
//! the supervision) to an exit.

use std::io;
use std::os::unix::process::ExitStatusExt as _;

use crate::store::{ErrorKind, StoreError};
use crate::supervise::{Ended, Outcome, SuperviseError};

/// `status`, `release`, `reset`: nothing there, or nothing to do.
pub const NOTHING: i32 = 1;
pub const USAGE: i32 = 2;
pub const CONFLICT: i32 = 65;
pub const UNAVAILABLE: i32 = 69;
pub const SLOT_LOST: i32 = 76;
pub const DENIED: i32 = 77;
/// The store's own configuration breaks the semaphore's promise.
pub const CONFIG: i32 = 78;
pub const NOT_EXECUTABLE: i32 = 126;
pub const NOT_FOUND: i32 = 127;

/// How `consem run` ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    /// Die of this signal, as the command did or as the signal that ended
    /// the wait would have had it, so that a shell sees it (`sys::die_of`).
    Signal(i32),
}

impl Exit {
    /// Ends consem this way.
    pub fn finish(self) -> ! {
        match self {
            Exit::Code(code) => std::process::exit(code),
            Exit::Signal(signal) => crate::sys::die_of(signal),
        }
    }
}

/// The exit code of a store's failure.
pub fn exit_code_of(error: &StoreError) -> i32 {
    match error.kind {
        ErrorKind::Usage => USAGE,
        ErrorKind::Conflict => CONFLICT,
        ErrorKind::Unavailable => UNAVAILABLE,
        ErrorKind::Denied => DENIED,
        ErrorKind::Config => CONFIG,
    }
}

/// How `consem run` exits once its run ended; `no_slot` is `-E`'s code.
pub fn of_run(ended: &Ended, no_slot: i32) -> Exit {
    match ended {
        Ok(Outcome::ChildExited(status)) => match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(signal)) => Exit::Signal(signal),
            (None, None) => Exit::Code(1),
        },
        Ok(Outcome::NoSlot(_)) => Exit::Code(no_slot),
        Ok(Outcome::Interrupted(signal)) => Exit::Signal(*signal),
        Ok(Outcome::SlotLost) => Exit::Code(SLOT_LOST),
        Err(SuperviseError::Store(error)) => Exit::Code(exit_code_of(error)),
        Err(SuperviseError::Spawn { error, .. }) if error.kind() == io::ErrorKind::NotFound => {
            Exit::Code(NOT_FOUND)
        }
        // Found, but it cannot run: as shells report a bad interpreter.
        Err(SuperviseError::Spawn { .. } | SuperviseError::Interpreter { .. }) => {
            Exit::Code(NOT_EXECUTABLE)
        }
        // The command cannot run guarded: consem cannot start, as when
        // its store cannot be used.
        Err(SuperviseError::Watchdog(_)) => Exit::Code(UNAVAILABLE),
    }
}

#[cfg(test)]
mod tests {
    use std::process::ExitStatus;

    use super::*;

    fn exited(raw: i32) -> Ended {
        Ok(Outcome::ChildExited(ExitStatus::from_raw(raw)))
    }

    #[test]
    fn a_command_that_ran_gives_its_own_status() {
        assert_eq!(of_run(&exited(0), 75), Exit::Code(0));
        assert_eq!(of_run(&exited(3 << 8), 75), Exit::Code(3));
        // Killed by SIGINT (2): consem dies of it too.
        assert_eq!(of_run(&exited(2), 75), Exit::Signal(2));
    }

    #[test]
    fn a_run_without_the_command_has_consems_codes() {
        let no_slot = || {
            Ok(Outcome::NoSlot(crate::supervise::NoSlot {
                timeout: None,
                seen: None,
            }))
        };
        assert_eq!(of_run(&no_slot(), 75), Exit::Code(75));
        assert_eq!(of_run(&no_slot(), 0), Exit::Code(0));
        assert_eq!(of_run(&Ok(Outcome::Interrupted(15)), 75), Exit::Signal(15));
        assert_eq!(of_run(&Ok(Outcome::SlotLost), 75), Exit::Code(SLOT_LOST));
    }

    #[test]
    fn each_error_has_its_code() {
        let store = |error| of_run(&Err(SuperviseError::Store(error)), 75);
        assert_eq!(store(StoreError::usage(String::new())), Exit::Code(2));
        assert_eq!(store(StoreError::conflict(String::new())), Exit::Code(65));
        assert_eq!(
            store(StoreError::unavailable(String::new())),
            Exit::Code(69)
        );
        assert_eq!(store(StoreError::denied(String::new())), Exit::Code(77));
        assert_eq!(store(StoreError::config(String::new())), Exit::Code(78));
        let spawn = |kind| {
            let error = io::Error::from(kind);
            let program = "x".to_string();
            of_run(&Err(SuperviseError::Spawn { program, error }), 75)
        };
        assert_eq!(spawn(io::ErrorKind::NotFound), Exit::Code(127));
        assert_eq!(spawn(io::ErrorKind::PermissionDenied), Exit::Code(126));
        let watchdog = SuperviseError::Watchdog(io::Error::from_raw_os_error(libc::EAGAIN));
        assert_eq!(of_run(&Err(watchdog), 75), Exit::Code(69));
    }
}
