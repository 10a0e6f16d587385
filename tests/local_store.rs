//! What only the local store does: the kernel gives a dead consem's slot
//! back at once, its lock files never reach the command, Consul's options
//! are refused, and its record is never overwritten when it is not ours.
//! The behaviour every store shares is in tests/conformance.rs.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::wait_until;
use common::world::*;

fn local_dir(world: &World) -> std::path::PathBuf {
    world.local.clone().expect("a local world")
}

/// The directory the local store keeps the world's prefix in.
fn prefix_dir(world: &World) -> std::path::PathBuf {
    let entries: Vec<_> = std::fs::read_dir(local_dir(world))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries[0].clone()
}

#[test]
fn a_killed_consem_gives_its_slot_back_at_once() {
    let world = World::local("killed");
    let script = format!("echo $$ > '{}'; exec sleep 300", world.path("pid"));
    let holder = world.spawn(1, &[], &["sh", "-c", &script]);
    let child = read_pid(&world, "pid");
    let waiter = world.spawn(1, &[], &["touch", &world.path("waiter-ran")]);
    wait_until(PROMPT, "the waiter to join the queue", || {
        world.contender_keys() == 2
    });
    signal(&holder, libc::SIGKILL);
    // No TTL to run out: the kernel drops the dead consem's locks, the
    // parent-death signal ends its command, and the waiter goes ahead.
    wait_until(PROMPT, "the waiter to run its command", || {
        world.exists("waiter-ran")
    });
    wait_until(PROMPT, "the killed consem's command to be gone", || {
        process_gone(child)
    });
    let mut waiter = waiter;
    let status = wait_with_deadline(&mut waiter, PROMPT, "the waiter to exit");
    assert_eq!(status.code(), Some(0));
    finish(holder);
    world.assert_clean();
}

#[test]
fn the_lock_files_never_reach_the_command() {
    let world = World::local("no-leak");
    let output = world
        .consem(1, &[], &["sh", "-c", "ls -l /proc/$$/fd"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let fds = String::from_utf8_lossy(&output.stdout);
    let dir = local_dir(&world);
    assert!(
        !fds.contains(dir.to_str().unwrap()),
        "the command holds the store's files open:\n{fds}"
    );
    assert!(!fds.contains("inotify"), "{fds}");
    world.assert_clean();
}

#[test]
fn consul_options_and_ttls_are_refused_with_one_line() {
    let world = World::local("refused");
    for (extra, names) in [
        (
            &["--ca-file", "ca.pem"][..],
            "--ca-file is an option of the Consul store",
        ),
        (
            &["--http-addr", "127.0.0.1:1"],
            "--http-addr is an option of the Consul store",
        ),
        (&["--ttl", "20s"], "--ttl does not apply to the local store"),
    ] {
        let output = world
            .consem(1, extra, &["touch", &world.path("ran")])
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(2),
            "{extra:?}: {}",
            stderr(&output)
        );
        let text = stderr(&output);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(names), "{text}");
    }
    let output = world
        .consem(2000, &[], &["touch", &world.path("ran")])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("more than the local store keeps"));
    assert!(!world.exists("ran"));
    let output = world
        .admin("status", &["--token", "t"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}

#[test]
fn the_fence_survives_a_reset_and_keeps_growing() {
    let world = World::local("fence-reset");
    let fence = |limit: u32| -> u64 {
        let output = world
            .consem(limit, &[], &["sh", "-c", "printf %s \"$CONSEM_FENCE\""])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        String::from_utf8_lossy(&output.stdout).parse().unwrap()
    };
    let first = fence(1);
    let holder = hold_slot(&world, 1, "ready", "go");
    let reset = world.admin("reset", &["--force"]).output().unwrap();
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    assert_eq!(finish(holder).status.code(), Some(76));
    // A new limit after the reset, and a fence past every earlier one.
    let after = fence(3);
    assert!(
        after > first + 1,
        "{after} after {first} and the evicted holder's"
    );
    world.assert_clean();
}

#[test]
fn a_record_that_is_not_ours_is_a_conflict_and_stays_untouched() {
    let world = World::local("foreign-state");
    // Make the prefix's directory, then put something else in its record.
    let output = world.consem(1, &[], &["true"]).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let state = prefix_dir(&world).join("state");
    std::fs::write(&state, b"not a record").unwrap();
    let output = world
        .consem(1, &[], &["touch", &world.path("ran")])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
    assert!(stderr(&output).contains("not a consem local semaphore record"));
    assert!(!world.exists("ran"));
    assert_eq!(std::fs::read(&state).unwrap(), b"not a record");
    std::fs::remove_file(&state).unwrap();
}

#[test]
fn a_waiter_that_waits_does_not_poll() {
    // Not a timing: the waiter behind another waiter sleeps in the kernel
    // (on that waiter's queue file), and the first waiter in inotify.
    let world = World::local("asleep");
    let holder = hold_slot(&world, 1, "ready", "go");
    let first = world.spawn(1, &[], &["true"]);
    wait_until(PROMPT, "the first waiter to join the queue", || {
        world.contender_keys() == 2
    });
    let second = world.spawn(1, &[], &["true"]);
    wait_until(PROMPT, "the second waiter to join the queue", || {
        world.contender_keys() == 3
    });
    let asleep_in = |pid: u32| -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.unwrap().path().join("wchan")).ok())
            .collect()
    };
    let mut seen = (Vec::new(), Vec::new());
    let asleep = (0..200).any(|_| {
        seen = (asleep_in(first.id()), asleep_in(second.id()));
        let done =
            seen.0.iter().any(|w| w.contains("poll")) && seen.1.iter().any(|w| w.contains("lock"));
        if !done {
            std::thread::sleep(Duration::from_millis(50));
        }
        done
    });
    assert!(asleep, "where the waiters sleep: {seen:?}");
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    assert_eq!(finish(first).status.code(), Some(0));
    assert_eq!(finish(second).status.code(), Some(0));
    world.assert_clean();
}

/// A directory every user may write to, as the default /run/lock/consem
/// is, with a prefix's directory made by consem in it.
fn shared_store(world: &World) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let base = world.dir.join("shared");
    std::fs::create_dir(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let run = shared_run(world, &base, "true").output().unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let entries: Vec<_> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let mode = std::fs::metadata(&entries[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o1777, 0o1777, "a sticky prefix directory: {mode:o}");
    (base, entries[0].clone())
}

/// `sh -c 'PLANT; exec consem run ...'`: the shell's pid is consem's, so
/// the script can plant files named after it before consem starts.
fn shared_run(world: &World, base: &std::path::Path, plant: &str) -> std::process::Command {
    let mut command = std::process::Command::new("sh");
    command
        .args([
            "-c",
            &format!(
                "{plant}; exec \"$0\" run --store \"local:$1\" --prefix \"$2\" --limit 1 -- true"
            ),
            env!("CARGO_BIN_EXE_consem"),
        ])
        .arg(base)
        .arg(&world.prefix)
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// In a shared directory another user can plant links where consem's files
/// go (its record's temporary, named after its pid; `meta`): consem never
/// writes through them, so the files they point to are never touched.
#[test]
fn links_planted_in_a_shared_directory_are_never_followed() {
    let world = World::local("planted-links");
    let (base, prefix) = shared_store(&world);
    let victim = world.dir.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let plant = format!(
        "ln -s '{}' '{}'/state.$$.tmp",
        victim.display(),
        prefix.display()
    );
    let run = shared_run(&world, &base, &plant).output().unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    // A link in place of `meta` is refused, not written through.
    std::fs::remove_file(prefix.join("meta")).unwrap();
    std::os::unix::fs::symlink(&victim, prefix.join("meta")).unwrap();
    let run = shared_run(&world, &base, "true").output().unwrap();
    assert_ne!(run.status.code(), Some(0), "{}", stderr(&run));
    assert_eq!(stderr(&run).lines().count(), 1, "{}", stderr(&run));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

/// A prefix's directory that every user may write to without the sticky
/// bit lets anyone replace the semaphore's files: refused, with the fix.
#[test]
fn a_shared_prefix_directory_without_the_sticky_bit_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let world = World::local("not-sticky");
    let (base, prefix) = shared_store(&world);
    std::fs::set_permissions(&prefix, std::fs::Permissions::from_mode(0o777)).unwrap();
    let run = shared_run(&world, &base, "true").output().unwrap();
    assert_eq!(run.status.code(), Some(77), "{}", stderr(&run));
    assert!(stderr(&run).contains("chmod +t"), "{}", stderr(&run));
}

/// `rm -rf` of a prefix's directory wakes nobody, and the next contender
/// takes the slot at once: the holder must notice soon, stop its command
/// and exit 76.
#[test]
fn a_holder_whose_directory_is_deleted_stops_its_command() {
    let world = World::local("directory-deleted");
    let mut holder = world.spawn(
        1,
        &["--kill-grace", "1s"],
        &strs(&world.held_until("ready", "go", 0)),
    );
    wait_until(PROMPT, "the holder's command to start", || {
        world.exists("ready")
    });
    std::fs::remove_dir_all(prefix_dir(&world)).unwrap();
    let status = wait_with_deadline(&mut holder, PROMPT, "the holder to notice");
    assert_eq!(status.code(), Some(76));
}
