//! The status line while waiting: drawn on a terminal, updated as the queue
//! changes, fitted to the window's width and redrawn when it changes,
//! erased when the command starts and on Ctrl-C; absent when stderr is not
//! a terminal. What the terminal shows is read through an emulator.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Child, Stdio};

use crate::common::pty::{spawn_on_terminal_sized, Screen, Terminal};
use crate::common::wait_until;
use crate::common::world::*;

#[test]
fn a_waiter_on_a_terminal_shows_who_holds_and_erases_the_line() {
    let world = World::consul("progress-tty");
    let holder = hold_slot(&world, 1, "ready", "go");
    let holder_pid = holder.id();
    // Wide enough for the whole line.
    let (mut waiter, terminal) =
        spawn_on_terminal_sized(world.consem(1, &[], &["echo", "RAN"]), 300, 24)
            .expect("a pseudo-terminal");
    let screen = terminal.screen.clone();
    let wanted = format!("waiting for a slot at {}: 1/1 held (", world.prefix);
    screen.wait_for(&wanted);
    screen.wait_for(&format!("pid {holder_pid}, started "));
    screen.wait_for("next in line");
    // The clock moves: the line is redrawn with a later time.
    screen.wait_for("00:01");
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    assert_eq!(
        wait_with_deadline(&mut waiter, PROMPT, "the waiter to exit").code(),
        Some(0)
    );
    screen.wait_closed();
    // The line was erased before the command wrote.
    assert_eq!(shown(&screen), ["RAN"], "{:?}", screen.text());
    world.assert_clean();
}

#[test]
fn no_line_when_stderr_is_not_a_terminal() {
    let world = World::consul("progress-pipe");
    let holder = hold_slot(&world, 1, "ready", "go");
    let waiter = world
        .consem(1, &[], &["true"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(PROMPT, "the waiter's contender key", || {
        world.contender_keys() == 2
    });
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    let output = finish(waiter);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(stderr(&output), "", "quiet without a terminal");
    world.assert_clean();
}

/// The rows of the screen that show something.
fn shown(screen: &Screen) -> Vec<String> {
    screen
        .rows()
        .into_iter()
        .filter(|row| !row.is_empty())
        .collect()
}

/// A world on the local store with `prefix` (its directory is the test's
/// own), both of its two slots held.
fn two_slots_held(name: &str, prefix: &str) -> (World<LocalStore>, [Child; 2]) {
    let mut world = World::local(name);
    world.prefix = prefix.to_string();
    let first = hold_slot(&world, 2, "first-ready", "go");
    let second = hold_slot(&world, 2, "second-ready", "go");
    (world, [first, second])
}

/// Ends the holders' commands, and so their hold.
fn let_go(world: &World<LocalStore>, holders: [Child; 2]) {
    world.touch("go");
    for holder in holders {
        assert_eq!(finish(holder).status.code(), Some(0));
    }
}

/// Whether `text` holds a whole draw of the line: erase, text, back to its
/// start.
fn a_draw_in(text: &str) -> bool {
    text.split_once("\r\x1b[J")
        .is_some_and(|(_, drawn)| drawn.contains('\r'))
}

/// Waits until a draw sent after `mark` is shown, then for the screen to
/// show one line, the waiting line drawn for a window of `columns`: within
/// the columns before the last, with who waits for what, the slots held,
/// the place in line and the time waited, and the cursor at its start.
/// Returns it.
fn the_line_at(terminal: &Terminal, columns: usize, mark: usize) -> String {
    let screen = &terminal.screen;
    let mut line = String::new();
    let drawn = |row: &str| {
        let clock = row.rsplit(", ").next().unwrap_or("");
        row.chars().count() < columns
            && row.contains("demo: 2/2")
            && row.contains(", next")
            && clock.len() == 5
            && clock.chars().filter(char::is_ascii_digit).count() == 4
            && clock.as_bytes()[2] == b':'
    };
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(
            PROMPT,
            &format!("one waiting line for {columns} columns"),
            || {
                a_draw_in(&screen.text_since(mark))
                    && match shown(screen).as_slice() {
                        [row] if drawn(row) => {
                            line = row.clone();
                            true
                        }
                        _ => false,
                    }
            },
        )
    }));
    if let Err(panic) = waited {
        eprintln!("screen: {:#?}\nsent: {:?}", screen.rows(), screen.text());
        std::panic::resume_unwind(panic);
    }
    let row = screen.rows().iter().position(|row| *row == line).unwrap();
    assert_eq!(
        screen.cursor(),
        (row as u16, 0),
        "the cursor waits at the line's start"
    );
    line
}

/// Resizes the window right after a draw, and returns a mark from which
/// the draw for the new width is to come. (Right after: a draw on its way
/// while the window changes lands wrapped at the new width, in an emulator
/// as in any terminal, and consem cannot tell that from a line that was
/// cut or reflowed; the next draw is a second away.)
fn resize_after_a_draw(terminal: &mut Terminal, columns: u16) -> usize {
    let mark = terminal.screen.sent();
    wait_until(PROMPT, "a draw of the line", || {
        a_draw_in(&terminal.screen.text_since(mark))
    });
    let mark = terminal.screen.sent();
    terminal.resize(columns, 24);
    mark
}

/// Starts a waiter at `world` on a terminal of `columns`, checks its line
/// and returns it once consem, interrupted by a Ctrl-C, has left nothing
/// of it on the screen.
fn interrupted_at(world: &World<LocalStore>, columns: u16) -> String {
    let (mut waiter, mut terminal) =
        spawn_on_terminal_sized(world.consem(2, &[], &["echo", "RAN"]), columns, 24)
            .expect("a pseudo-terminal");
    let line = the_line_at(&terminal, columns.into(), 0);
    // The terminal echoes ^C; consem erases the line and dies of SIGINT.
    terminal.type_in(b"\x03");
    let status = wait_with_deadline(&mut waiter, PROMPT, "the waiter to exit");
    assert_eq!(status.signal(), Some(libc::SIGINT));
    terminal.screen.wait_closed();
    // Nothing of the line is left, nor a ^C past its end. (A ^C the
    // terminal echoed after the erase would stand alone at a row's start,
    // as after any command.)
    let left = shown(&terminal.screen);
    assert!(
        left.iter().all(|row| row == "^C"),
        "at {columns} columns, left on the screen: {left:?}\nsent: {:?}",
        terminal.screen.text()
    );
    line
}

#[test]
fn at_each_width_the_line_keeps_what_matters_and_ctrl_c_leaves_nothing() {
    let (world, holders) = two_slots_held("progress-widths", "demo");
    let pids = holders.each_ref().map(Child::id);
    for columns in [40, 80, 100, 200] {
        let line = interrupted_at(&world, columns);
        match columns {
            40 => assert!(
                line.starts_with("waiting at demo: 2/2 held, next, "),
                "{line}"
            ),
            200 => assert!(
                line.starts_with("waiting for a slot at demo: 2/2 held (")
                    && pids
                        .iter()
                        .all(|pid| line.contains(&format!(" pid {pid}, started ")))
                    && line.contains("), next in line, "),
                "every holder told in 200 columns: {line}"
            ),
            // How much of the holders fits depends on the host's name.
            _ => assert!(
                line.starts_with("waiting for a slot at demo: 2/2 held (")
                    && line.contains("), next in line, "),
                "{line}"
            ),
        }
    }
    let_go(&world, holders);
    world.assert_clean();
}

#[test]
fn a_line_that_fills_the_window_leaves_nothing_on_ctrl_c() {
    // Prefixes as long as makes the line, without the holders' details,
    // take every column but the last: `waiting at xdemo: 2/2 held, next,
    // 00:00` in 40, `waiting for a slot at ...demo: 2/2 held, next in line,
    // 00:00` in the others. The echoed ^C would wrap past such a line's
    // end.
    for (columns, length) in [(40u16, 5), (80, 26), (100, 46), (200, 146)] {
        let prefix = format!("{}demo", "x".repeat(length - 4));
        let (world, holders) = two_slots_held("progress-full-width", &prefix);
        let line = interrupted_at(&world, columns);
        assert_eq!(line.chars().count(), usize::from(columns) - 1, "{line}");
        let_go(&world, holders);
        world.assert_clean();
    }
}

#[test]
fn a_resize_leaves_one_line_drawn_for_the_new_width() {
    let (world, holders) = two_slots_held("progress-resize", "demo");
    let (mut waiter, mut terminal) =
        spawn_on_terminal_sized(world.consem(2, &[], &["echo", "RAN"]), 200, 24)
            .expect("a pseudo-terminal");
    let full = the_line_at(&terminal, 200, 0);
    assert!(full.contains("; "), "both holders told: {full}");
    // Narrower (the emulator cuts the line that was drawn, as xterm does),
    // wider again, and narrower than the words around the numbers.
    for columns in [100, 40, 80, 200, 24] {
        let mark = resize_after_a_draw(&mut terminal, columns);
        let line = the_line_at(&terminal, columns.into(), mark);
        if columns == 24 {
            assert!(line.starts_with("demo: 2/2, next, "), "{line}");
        }
    }
    let_go(&world, holders);
    assert_eq!(
        wait_with_deadline(&mut waiter, PROMPT, "the waiter to exit").code(),
        Some(0)
    );
    terminal.screen.wait_closed();
    assert_eq!(
        shown(&terminal.screen),
        ["RAN"],
        "{:?}",
        terminal.screen.text()
    );
    world.assert_clean();
}
