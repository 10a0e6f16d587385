//! The status line while waiting: drawn on a terminal, updated as the queue
//! changes, erased when the command starts; absent when stderr is not a
//! terminal.

mod common;

use std::process::Stdio;

use common::pty::spawn_on_terminal;
use common::wait_until;
use common::world::*;

#[test]
fn a_waiter_on_a_terminal_shows_who_holds_and_erases_the_line() {
    let world = World::new("progress-tty");
    let holder = hold_slot(&world, 1, "ready", "go");
    let holder_pid = holder.id();
    let (mut waiter, terminal) = match spawn_on_terminal(world.consem(1, &[], &["echo", "RAN"])) {
        Ok(started) => started,
        Err(error) => {
            eprintln!("skipped: cannot open a pseudo-terminal: {error}");
            world.touch("go");
            finish(holder);
            return;
        }
    };
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
    let world = World::new("progress-pipe");
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
