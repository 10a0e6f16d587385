//! The status line while waiting: drawn on a terminal, updated as the queue
//! changes, erased when the command starts; absent when stderr is not a
//! terminal.

use std::process::Stdio;

use crate::common::pty::spawn_on_terminal;
use crate::common::wait_until;
use crate::common::world::*;

#[test]
fn a_waiter_on_a_terminal_shows_who_holds_and_erases_the_line() {
    let world = World::consul("progress-tty");
    let holder = hold_slot(&world, 1, "ready", "go");
    let holder_pid = holder.id();
    let (mut waiter, mut terminal) =
        spawn_on_terminal(world.consem(1, &[], &["echo", "RAN"])).expect("a pseudo-terminal");
    // Wide enough for the whole line.
    terminal.resize(300, 24);
    let screen = terminal.screen.clone();
    let wanted = format!("waiting for a slot at {}: 1/1 held (", world.prefix);
    screen.wait_for(&wanted);
    screen.wait_for(&format!("pid {holder_pid}, started "));
    screen.wait_for("next in line");
    // The clock moves: the line is redrawn with a later time.
    screen.wait_for("00:01");
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    screen.wait_for("RAN");
    assert_eq!(
        wait_with_deadline(&mut waiter, PROMPT, "the waiter to exit").code(),
        Some(0)
    );
    let text = screen.text();
    let erased = text.rfind("\r\x1b[2K").expect("the line is erased");
    let ran = text.rfind("RAN").unwrap();
    assert!(erased < ran, "erased before the command ran: {text:?}");
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

/// What the waiting line drew each time: the text after each "erase the
/// line" sequence, up to the next one or the end of the line.
fn draws(text: &str) -> Vec<String> {
    text.split("\r\x1b[2K")
        .skip(1)
        .map(|draw| draw.split(['\r', '\n']).next().unwrap_or("").to_string())
        .filter(|draw| draw.starts_with("waiting"))
        .collect()
}

/// Columns a draw takes (the test's prefix and hosts are ASCII; the
/// ellipsis is one column).
fn columns(draw: &str) -> usize {
    draw.chars().count()
}

#[test]
fn the_line_fits_a_narrow_window_and_follows_a_resize() {
    let world = World::consul("progress-narrow-window");
    let holder = hold_slot(&world, 1, "ready", "go");
    let (mut waiter, mut terminal) =
        spawn_on_terminal(world.consem(1, &[], &["echo", "RAN"])).expect("a pseudo-terminal");
    let screen = terminal.screen.clone();
    screen.wait_for("waiting for a slot");
    terminal.resize(40, 24);
    wait_until(PROMPT, "a draw cut to 39 columns", || {
        draws(&screen.text())
            .last()
            .is_some_and(|draw| columns(draw) == 39 && draw.ends_with('…'))
    });
    terminal.resize(24, 24);
    wait_until(PROMPT, "a draw cut to 23 columns after the resize", || {
        draws(&screen.text())
            .last()
            .is_some_and(|draw| columns(draw) == 23 && draw.ends_with('…'))
    });
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    screen.wait_for("RAN");
    assert_eq!(
        wait_with_deadline(&mut waiter, PROMPT, "the waiter to exit").code(),
        Some(0)
    );
    let text = screen.text();
    // Never wider than the window it was drawn in, so that nothing wrapped
    // and stayed behind: every draw fits the widest window it had.
    assert!(
        draws(&text).iter().all(|draw| columns(draw) <= 79),
        "{text:?}"
    );
    // The last draw is erased before the command writes.
    let erased = text.rfind("\r\x1b[2K").unwrap();
    assert!(erased < text.rfind("RAN").unwrap(), "{text:?}");
    world.assert_clean();
}
