//! What only the local store does: the kernel gives a dead consem's slot
//! back at once, its lock files never reach the command, Consul's options
//! are refused, and its record is never overwritten when it is not ours.
//! The behaviour every store shares is in tests/conformance.rs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::common::wait_until;
use crate::common::world::*;

/// The directory the local store keeps the world's prefix in.
fn prefix_dir(world: &World<LocalStore>) -> std::path::PathBuf {
    let entries: Vec<_> = std::fs::read_dir(&world.store.base)
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
    assert!(
        !fds.contains(world.store.base.to_str().unwrap()),
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
        (
            &["--ttl", "20s"],
            "--ttl applies to Consul, Redis, etcd, PostgreSQL and ZooKeeper, whose slots are leases; the local store's slot is",
        ),
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

/// Waiters joined one at a time behind `holders` held slots, each of which
/// writes its place in the queue and its fence to `granted` when it runs.
fn queue_behind_holders(world: &World<LocalStore>, limit: u32, waiters: usize) -> Vec<Child> {
    (0..waiters)
        .map(|place| {
            let script = format!("echo $CONSEM_FENCE {place} >> '{}'", world.path("granted"));
            let waiter = world.spawn(limit, &[], &["sh", "-c", &script]);
            wait_until(PROMPT, "the waiter to join the queue", || {
                world.contender_keys() == limit as usize + place + 1
            });
            waiter
        })
        .collect()
}

/// The places in the queue of the waiters that ran, in the order of their
/// fences (the order the slots were granted in).
fn granted(world: &World<LocalStore>) -> Vec<usize> {
    let text = std::fs::read_to_string(world.path("granted")).unwrap();
    let mut grants: Vec<(u64, usize)> = text
        .lines()
        .map(|line| {
            let (fence, place) = line.split_once(' ').unwrap();
            (fence.parse().unwrap(), place.parse().unwrap())
        })
        .collect();
    grants.sort();
    grants.into_iter().map(|(_, place)| place).collect()
}

/// A queue longer than the slots gets them in the order it arrived in,
/// several at a time when several holders leave at once.
#[test]
fn a_queue_gets_its_slots_in_order_of_arrival() {
    let world = World::local("arrival");
    let limit = 3;
    let holders: Vec<Child> = (0..limit)
        .map(|i| {
            let holder = world.spawn(
                limit,
                &[],
                &strs(&world.held_until(&format!("ready{i}"), "go", 0)),
            );
            wait_until(PROMPT, "the holder's child to start", || {
                world.exists(&format!("ready{i}"))
            });
            holder
        })
        .collect();
    let waiters = queue_behind_holders(&world, limit, 12);
    world.touch("go");
    for child in holders.into_iter().chain(waiters) {
        assert_eq!(finish(child).status.code(), Some(0));
    }
    assert_eq!(granted(&world), (0..12).collect::<Vec<_>>());
    world.assert_clean();
}

/// Waiters killed at the front of a long queue, in its middle and at its
/// back are skipped at once: the waiter behind each one, asleep on its
/// queue file's lock, wakes when the kernel drops it and removes the dead
/// one's files, while the slot is still held; the others keep their order.
#[test]
fn dead_waiters_anywhere_in_a_long_queue_are_skipped_at_once() {
    let world = World::local("dead-waiters");
    let holder = hold_slot(&world, 1, "ready", "go");
    let mut waiters: Vec<Option<Child>> = queue_behind_holders(&world, 1, 12)
        .into_iter()
        .map(Some)
        .collect();
    let dir = prefix_dir(&world);
    // The holder has ticket 0; the waiter at place p has ticket p + 1. The
    // last one has nobody behind it to wake: it is skipped (and its files
    // removed) when the queue reaches it.
    let killed = [0, 6, 7, 11];
    for place in killed {
        let waiter = waiters[place].take().unwrap();
        signal(&waiter, libc::SIGKILL);
        finish(waiter);
    }
    wait_until(PROMPT, "the dead waiters' files to be removed", || {
        killed[..3]
            .iter()
            .all(|place| !dir.join(format!("{}.c", place + 1)).exists())
    });
    assert!(
        !world.exists("granted"),
        "a waiter ran while the slot was held"
    );
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    for waiter in waiters.into_iter().flatten() {
        assert_eq!(finish(waiter).status.code(), Some(0));
    }
    let expected: Vec<usize> = (0..12).filter(|p| !killed.contains(p)).collect();
    assert_eq!(granted(&world), expected);
    world.assert_clean();
}

/// A record an older consem wrote (no start of the queue in it) is read as
/// it stands, fence and tickets going on from it; the start of the queue
/// is found from the files, and kept from then on.
#[test]
fn a_record_of_an_older_consem_goes_on_where_it_stood() {
    let world = World::local("older-record");
    assert_eq!(
        world
            .consem(1, &[], &["true"])
            .output()
            .unwrap()
            .status
            .code(),
        Some(0)
    );
    let state = prefix_dir(&world).join("state");
    std::fs::write(
        &state,
        br#"{"limit":null,"next":7,"fence":41,"holders":[]}"#,
    )
    .unwrap();
    let output = world
        .consem(1, &[], &["sh", "-c", "echo $CONSEM_FENCE"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "42");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(record["next"], 8, "{record}");
    assert_eq!(record["waiting_from"], 8, "{record}");
    world.assert_clean();
}

/// How many inotify descriptors the process `pid` has open.
fn inotify_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter(|target| target.to_string_lossy().contains("inotify"))
                .count()
        })
        .unwrap_or(0)
}

/// The first waiter watches the directory while it waits, and lets the
/// watch go once it holds: a user's inotify instances (128 by default) are
/// not held for its commands' length, one per holder that queued.
#[test]
fn a_holder_that_waited_first_keeps_no_inotify_descriptor() {
    let world = World::local("unwatch");
    let holder = hold_slot(&world, 1, "ready", "go");
    let waiter = world.spawn(1, &[], &strs(&world.held_until("ready2", "go2", 0)));
    wait_until(PROMPT, "the first waiter to watch the directory", || {
        inotify_descriptors(waiter.id()) == 1
    });
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    wait_until(PROMPT, "the waiter's command to start", || {
        world.exists("ready2")
    });
    wait_until(
        PROMPT,
        "the holder's inotify descriptor to be closed",
        || inotify_descriptors(waiter.id()) == 0,
    );
    world.touch("go2");
    assert_eq!(finish(waiter).status.code(), Some(0));
    world.assert_clean();
}

/// A directory every user may write to, as the default /run/lock/consem
/// is, with a prefix's directory made by consem in it.
fn shared_store(world: &World<LocalStore>) -> (std::path::PathBuf, std::path::PathBuf) {
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
fn shared_run(
    world: &World<LocalStore>,
    base: &std::path::Path,
    plant: &str,
) -> std::process::Command {
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

/// A waiter whose directory is removed by hand, and made again by a
/// newcomer, never takes a slot in the new one: that record forgot the
/// holders still running, and may hand the waiter's ticket to another. It
/// ends (69) with its command not run, and leaves the newcomer's files.
#[test]
fn a_waiter_whose_directory_is_made_again_never_takes_a_slot_in_it() {
    let world = World::local("directory-made-again");
    let limit = 2;
    let holders = [
        hold_slot(&world, limit, "ready0", "go"),
        hold_slot(&world, limit, "ready1", "go"),
    ];
    let mut waiters = ["ran0", "ran1"].map(|ran| {
        let script = format!("touch '{}'", world.path(ran));
        // Counted before the spawn: a waiter that joins at once is not missed.
        let joined = world.contender_keys() + 1;
        let waiter = world.spawn(limit, &[], &["sh", "-c", &script]);
        wait_until(PROMPT, "the waiter to join the queue", || {
            world.contender_keys() == joined
        });
        Some(waiter)
    });
    // The first waiter, stopped, sees nothing of what follows; the second
    // sleeps on its queue file until it dies.
    let first = waiters[0].take().unwrap();
    signal(&first, libc::SIGSTOP);
    std::fs::remove_dir_all(prefix_dir(&world)).unwrap();
    let newcomer = hold_slot(&world, limit, "ready-new", "go");
    signal(&first, libc::SIGKILL);
    finish(first);
    let mut second = waiters[1].take().unwrap();
    let status = wait_with_deadline(&mut second, PROMPT, "the second waiter to end");
    let stderr = String::from_utf8_lossy(&finish(second).stderr).into_owned();
    assert_eq!(status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("was deleted while we waited"), "{stderr}");
    assert!(
        !world.exists("ran1"),
        "the waiter ran in the directory made again"
    );
    for mut holder in holders {
        // Their directory went: a lost slot.
        let status = wait_with_deadline(&mut holder, PROMPT, "a holder to notice");
        assert_eq!(status.code(), Some(76));
    }
    world.touch("go");
    assert_eq!(finish(newcomer).status.code(), Some(0));
    world.assert_clean();
}

/// Who runs a consem in the tests of two users on one prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum User {
    Root,
    Nobody,
}

/// Root and `nobody` on one prefix of a store directory they share, made
/// as the default /run/lock/consem is (writable by all, sticky), with the
/// binary where `nobody` may run it and a scratch directory both write to.
struct TwoUsers {
    world: World<LocalStore>,
    base: PathBuf,
    bin: PathBuf,
    scratch: PathBuf,
}

impl TwoUsers {
    /// Fails, never skips, where `runuser` or the user `nobody` is missing.
    fn new(name: &str) -> TwoUsers {
        // SAFETY: geteuid cannot fail.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "the tests of two users run as root, to run consem as nobody with runuser"
        );
        match Command::new("runuser")
            .args(["-u", "nobody", "--", "true"])
            .status()
        {
            Ok(status) if status.success() => {}
            other => panic!(
                "runuser -u nobody -- true: {other:?}: the tests of two users need runuser (util-linux) and the user nobody"
            ),
        }
        let world = World::local(name);
        set_mode(&world.dir, 0o755);
        let bin = world.dir.join("consem");
        std::fs::copy(env!("CARGO_BIN_EXE_consem"), &bin).unwrap();
        set_mode(&bin, 0o755);
        let base = world.dir.join("shared");
        std::fs::create_dir(&base).unwrap();
        set_mode(&base, 0o1777);
        let scratch = world.dir.join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        set_mode(&scratch, 0o777);
        TwoUsers {
            world,
            base,
            bin,
            scratch,
        }
    }

    /// `consem` as `user`, its output piped, under a umask that lets
    /// nobody else read what it makes: what other users need of its files,
    /// consem must give them itself.
    fn consem(&self, user: User) -> Command {
        use std::os::unix::process::CommandExt as _;
        let mut command = match user {
            User::Root => Command::new(&self.bin),
            User::Nobody => {
                let mut command = Command::new("runuser");
                command.args(["-u", "nobody", "--"]).arg(&self.bin);
                command
            }
        };
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: umask is async-signal-safe and touches no memory.
        unsafe {
            command.pre_exec(|| {
                libc::umask(0o077);
                Ok(())
            });
        }
        command
    }

    fn store(&self) -> String {
        format!("--store=local:{}", self.base.display())
    }

    /// `consem run` as `user` of `sh -c script`.
    fn run(&self, user: User, limit: u32, extra: &[&str], script: &str) -> Command {
        let mut command = self.consem(user);
        command
            .args(["run", &self.store(), "--prefix", &self.world.prefix])
            .args(["--limit", &limit.to_string()])
            .args(extra)
            .args(["--", "sh", "-c", script]);
        command
    }

    /// `consem <subcommand>` (status, release, reset) as `user`.
    fn admin(&self, user: User, subcommand: &str, extra: &[&str]) -> Output {
        let child = self
            .consem(user)
            .args([subcommand, &self.store(), "--prefix", &self.world.prefix])
            .args(extra)
            .spawn()
            .unwrap();
        finish_within(child)
    }

    fn path(&self, name: &str) -> String {
        self.scratch.join(name).display().to_string()
    }

    /// A command that writes its fence to `<name>.fence`.
    fn fence_script(&self, name: &str) -> String {
        format!(
            "echo $CONSEM_FENCE > '{}'",
            self.path(&format!("{name}.fence"))
        )
    }

    /// A holder as `user` whose command writes its fence to `<name>.fence`,
    /// then says it runs and runs until `go(name)`; returned once it runs.
    fn hold(&self, user: User, limit: u32, name: &str) -> Child {
        let script = format!(
            "{}; touch '{}'; while [ ! -e '{}' ]; do sleep 0.02; done",
            self.fence_script(name),
            self.path(&format!("{name}.ready")),
            self.path(&format!("{name}.go"))
        );
        let mut holder = self.run(user, limit, &[], &script).spawn().unwrap();
        let ready = self.scratch.join(format!("{name}.ready"));
        wait_until(PROMPT, &format!("{name}'s command to start"), || {
            still_running(&mut holder, name);
            ready.exists()
        });
        holder
    }

    fn go(&self, name: &str) {
        std::fs::write(self.scratch.join(format!("{name}.go")), b"").unwrap();
    }

    fn fence(&self, name: &str) -> u64 {
        let text = std::fs::read_to_string(self.path(&format!("{name}.fence"))).unwrap();
        text.trim().parse().unwrap()
    }

    fn prefix_dir(&self) -> PathBuf {
        let entries: Vec<_> = std::fs::read_dir(&self.base)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        entries[0].clone()
    }

    /// The prefix directory's file names, sorted.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.prefix_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Live or not, the contender files in the prefix's directory.
    fn contenders(&self) -> usize {
        self.names().iter().filter(|n| n.ends_with(".c")).count()
    }

    fn state(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.prefix_dir().join("state")).unwrap()).unwrap()
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Panics with its stderr if `child` (named `what`) has exited.
fn still_running(child: &mut Child, what: &str) {
    if let Some(status) = child.try_wait().unwrap() {
        let mut text = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut text).unwrap();
        panic!("{what} exited early ({status}): {text}");
    }
}

fn finish_within(mut child: Child) -> Output {
    wait_with_deadline(&mut child, PROMPT, "consem to exit");
    child.wait_with_output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn code(output: &Output) -> Option<i32> {
    output.status.code()
}

/// The bug found by fault injection: root held a prefix, nobody's consem
/// could not rewrite the record (77) and left files that made every later
/// contender exit 69. Either way round, the second user now waits for the
/// slot, runs, and leaves the prefix as clean as one user would.
#[test]
fn two_users_share_a_prefix_whoever_comes_first() {
    for (first, second) in [(User::Root, User::Nobody), (User::Nobody, User::Root)] {
        let users = TwoUsers::new("two-users");
        let holder = users.hold(first, 1, "first");
        let mut waiter = users
            .run(second, 1, &[], &users.fence_script("second"))
            .spawn()
            .unwrap();
        wait_until(PROMPT, "the second user's consem to wait", || {
            still_running(&mut waiter, "the second user's consem");
            users.contenders() == 2
        });
        // One slot: the second waits while the first holds it.
        assert!(!users.scratch.join("second.fence").exists());
        users.go("first");
        let held = finish_within(holder);
        assert_eq!(code(&held), Some(0), "{first:?}: {}", stderr(&held));
        let waited = finish_within(waiter);
        assert_eq!(code(&waited), Some(0), "{second:?}: {}", stderr(&waited));
        let again = finish_within(
            users
                .run(first, 1, &[], &users.fence_script("third"))
                .spawn()
                .unwrap(),
        );
        assert_eq!(code(&again), Some(0), "{first:?}: {}", stderr(&again));
        let fences = [
            users.fence("first"),
            users.fence("second"),
            users.fence("third"),
        ];
        assert!(
            fences[0] < fences[1] && fences[1] < fences[2],
            "{first:?} then {second:?}: fences {fences:?}"
        );
        // Every user may lock `meta` and rewrite both it and `state`.
        for name in ["meta", "state"] {
            assert_eq!(mode_of(&users.prefix_dir().join(name)), 0o666, "{name}");
        }
        crate::common::local::assert_local_clean(&users.base);
    }
}

#[test]
fn the_limit_holds_with_both_users() {
    let users = TwoUsers::new("two-users-limit");
    let log = users.scratch.join("log");
    std::fs::write(&log, b"").unwrap();
    set_mode(&log, 0o666);
    let script = format!(
        "echo start >> '{0}'; sleep 0.2; echo end >> '{0}'",
        log.display()
    );
    let children: Vec<(User, Child)> = (0..8)
        .map(|i| {
            let user = if i % 2 == 0 { User::Root } else { User::Nobody };
            (user, users.run(user, 3, &[], &script).spawn().unwrap())
        })
        .collect();
    for (user, child) in children {
        let mut child = child;
        wait_with_deadline(&mut child, Duration::from_secs(60), "a contender to run");
        let output = child.wait_with_output().unwrap();
        assert_eq!(code(&output), Some(0), "{user:?}: {}", stderr(&output));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    let (mut running, mut most, mut starts) = (0i32, 0i32, 0);
    for line in log.lines() {
        if line == "start" {
            running += 1;
            starts += 1;
        } else {
            running -= 1;
        }
        most = most.max(running);
    }
    assert_eq!(starts, 8, "every contender ran:\n{log}");
    assert!(most <= 3, "{most} ran at once:\n{log}");
    crate::common::local::assert_local_clean(&users.base);
}

/// A join that fails after it made its files removes them: here nobody may
/// not rewrite a record that root's consem made without the mode every
/// user needs (as an older consem did). Root's next consem gives it that
/// mode, and nobody's then runs.
#[test]
fn a_join_that_fails_leaves_no_file() {
    let users = TwoUsers::new("failed-join");
    let first = finish_within(users.run(User::Root, 1, &[], "true").spawn().unwrap());
    assert_eq!(code(&first), Some(0), "{}", stderr(&first));
    let state = users.prefix_dir().join("state");
    set_mode(&state, 0o644);
    let before = users.names();
    let refused = finish_within(users.run(User::Nobody, 1, &[], "true").spawn().unwrap());
    assert_eq!(code(&refused), Some(77), "{}", stderr(&refused));
    let text = stderr(&refused);
    assert!(text.contains("belongs to root with mode 644"), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert_eq!(users.names(), before, "files left by the failed join");
    let repairs = finish_within(users.run(User::Root, 1, &[], "true").spawn().unwrap());
    assert_eq!(code(&repairs), Some(0), "{}", stderr(&repairs));
    assert_eq!(mode_of(&state), 0o666);
    let runs = finish_within(users.run(User::Nobody, 1, &[], "true").spawn().unwrap());
    assert_eq!(code(&runs), Some(0), "{}", stderr(&runs));
    crate::common::local::assert_local_clean(&users.base);
}

/// `state` deleted by hand, or cut short (a consem killed inside its
/// write), under two holders of two users: the record is rebuilt from the
/// live contenders' files, so the holders keep their slots, nobody takes
/// a third, the limit is still theirs, and the fence goes on past theirs.
#[test]
fn a_record_lost_under_holders_is_rebuilt_and_the_limit_and_fence_hold() {
    for cut_short in [false, true] {
        let users = TwoUsers::new("lost-record");
        let a = users.hold(User::Root, 2, "a");
        let b = users.hold(User::Nobody, 2, "b");
        let state = users.prefix_dir().join("state");
        if cut_short {
            let bytes = std::fs::read(&state).unwrap();
            std::fs::write(&state, &bytes[..bytes.len() / 2]).unwrap();
        } else {
            std::fs::remove_file(&state).unwrap();
        }
        for user in [User::Root, User::Nobody] {
            let full = finish_within(users.run(user, 2, &["--try"], "true").spawn().unwrap());
            assert_eq!(code(&full), Some(75), "{user:?}: {}", stderr(&full));
        }
        let other_limit = finish_within(users.run(User::Nobody, 3, &[], "true").spawn().unwrap());
        assert_eq!(code(&other_limit), Some(65), "{}", stderr(&other_limit));
        let status = users.admin(User::Nobody, "status", &[]);
        assert_eq!(code(&status), Some(0), "{}", stderr(&status));
        let shown = String::from_utf8_lossy(&status.stdout);
        assert!(shown.contains("2 of 2 slots held"), "{shown}");
        let mut waiter = users
            .run(User::Root, 2, &[], &users.fence_script("c"))
            .spawn()
            .unwrap();
        wait_until(PROMPT, "the waiter to join the queue", || {
            still_running(&mut waiter, "the waiter");
            users.contenders() == 3
        });
        users.go("a");
        let a = finish_within(a);
        assert_eq!(code(&a), Some(0), "{}", stderr(&a));
        let waited = finish_within(waiter);
        assert_eq!(code(&waited), Some(0), "{}", stderr(&waited));
        assert!(
            users.fence("c") > users.fence("a").max(users.fence("b")),
            "fences: a {}, b {}, then c {}",
            users.fence("a"),
            users.fence("b"),
            users.fence("c")
        );
        users.go("b");
        let b = finish_within(b);
        assert_eq!(code(&b), Some(0), "{}", stderr(&b));
        crate::common::local::assert_local_clean(&users.base);
    }
}

/// The files of the ticket the record hands out next, left by root (a join
/// that failed, a hand edit), and a stray contender file of nobody's: nobody
/// joins past them, status names the ones it cannot remove as stale, reset
/// says who can remove them, and root's reset does.
#[test]
fn stray_files_wedge_nothing_status_shows_them_and_reset_removes_them() {
    let users = TwoUsers::new("stray-files");
    let first = finish_within(users.run(User::Root, 1, &[], "true").spawn().unwrap());
    assert_eq!(code(&first), Some(0), "{}", stderr(&first));
    let next = users.state()["next"].as_u64().unwrap();
    let dir = users.prefix_dir();
    let root_files: Vec<PathBuf> = ["c", "q"]
        .iter()
        .map(|kind| dir.join(format!("{next}.{kind}")))
        .collect();
    for path in &root_files {
        std::fs::write(path, b"{}").unwrap();
    }
    let fifo = dir.join(format!("{next}.w"));
    let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o622) }, 0);
    let nobodys = dir.join(format!("{}.c", next + 1));
    let touched = Command::new("runuser")
        .args(["-u", "nobody", "--", "touch"])
        .arg(&nobodys)
        .status()
        .unwrap();
    assert!(touched.success());

    let ran = finish_within(
        users
            .run(User::Nobody, 1, &[], &users.fence_script("nobody"))
            .spawn()
            .unwrap(),
    );
    assert_eq!(code(&ran), Some(0), "{}", stderr(&ran));
    // Nobody removed its own stray file, and may not remove root's.
    assert!(!nobodys.exists());
    let stale = [root_files[0].clone(), root_files[1].clone(), fifo.clone()];
    for path in &stale {
        assert!(path.exists(), "{}", path.display());
    }

    for (user, remover) in [
        (User::Nobody, "consem reset as root removes them"),
        (User::Root, "consem reset removes them"),
    ] {
        let status = users.admin(user, "status", &[]);
        let shown = stdout(&status);
        assert!(shown.contains("STALE"), "{user:?}: {shown}");
        for path in &stale {
            assert!(
                shown.contains(&format!("{} (root)", path.display())),
                "{shown}"
            );
        }
        assert!(shown.contains(remover), "{user:?}: {shown}");
        let json = users.admin(user, "status", &["--json"]);
        let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(json["stale"].as_array().unwrap().len(), 1, "{json}");
    }
    let refused = users.admin(User::Nobody, "reset", &[]);
    let text = stderr(&refused);
    assert!(text.contains("could not remove"), "{text}");
    assert!(text.contains("as root"), "{text}");
    for path in &stale {
        assert!(path.exists(), "{}", path.display());
    }
    let reset = users.admin(User::Root, "reset", &[]);
    assert_eq!(code(&reset), Some(0), "{}", stderr(&reset));
    assert!(
        !stderr(&reset).contains("could not remove"),
        "{}",
        stderr(&reset)
    );
    crate::common::local::assert_local_clean(&users.base);
    let status = users.admin(User::Nobody, "status", &[]);
    assert!(!stdout(&status).contains("STALE"), "{}", stdout(&status));
}

/// Either user releases the other's holder: its consem is woken through
/// its FIFO, stops its command and exits 76, and the slot goes to the
/// other user's waiter.
#[test]
fn one_user_releases_the_others_holder() {
    for (holder_user, operator) in [(User::Nobody, User::Root), (User::Root, User::Nobody)] {
        let users = TwoUsers::new("release-other");
        let holder = users.hold(holder_user, 1, "held");
        let ticket = users.state()["holders"][0].as_u64().unwrap().to_string();
        let released = users.admin(operator, "release", &["--session", &ticket]);
        assert_eq!(code(&released), Some(0), "{}", stderr(&released));
        let lost = finish_within(holder);
        assert_eq!(code(&lost), Some(76), "{holder_user:?}: {}", stderr(&lost));
        let next = finish_within(users.run(operator, 1, &[], "true").spawn().unwrap());
        assert_eq!(code(&next), Some(0), "{operator:?}: {}", stderr(&next));
        crate::common::local::assert_local_clean(&users.base);
    }
}

/// Root's consem is killed while it holds the one slot: nobody probes its
/// contender file (which root's umask would have kept from other users),
/// sees it dead and takes the slot; the files nobody may not remove are
/// shown as stale, and removed by root's next consem.
#[test]
fn a_dead_contender_of_another_user_is_skipped() {
    let users = TwoUsers::new("dead-other");
    let holder = users.hold(User::Root, 1, "held");
    let status = users.admin(User::Nobody, "status", &[]);
    assert_eq!(code(&status), Some(0), "{}", stderr(&status));
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        shown.contains(&format!(" {} ", holder.id())),
        "root's holder described to nobody:\n{shown}"
    );
    signal(&holder, libc::SIGKILL);
    let _ = finish_within(holder);
    let ran = finish_within(users.run(User::Nobody, 1, &[], "true").spawn().unwrap());
    assert_eq!(code(&ran), Some(0), "{}", stderr(&ran));
    let status = users.admin(User::Nobody, "status", &[]);
    let shown = stdout(&status);
    assert!(shown.contains("STALE"), "{shown}");
    assert!(
        shown.contains("consem reset as root removes them"),
        "{shown}"
    );
    let ran = finish_within(users.run(User::Root, 1, &[], "true").spawn().unwrap());
    assert_eq!(code(&ran), Some(0), "{}", stderr(&ran));
    crate::common::local::assert_local_clean(&users.base);
}

/// A listing reads each prefix's directory under its lock, and makes and
/// mends nothing: a directory no contender finished making stays as it
/// was, and one made by hand is nobody's semaphore.
#[test]
fn a_listing_changes_nothing_in_the_store() {
    let world = World::local("list-nothing-made");
    let holder = hold_slot(&world, 2, "ready", "go");
    let base = world.store.base.clone();
    // Made by a contender that died before it made `meta`.
    let unfinished = base.join("consem-test%2Funfinished");
    std::fs::create_dir(&unfinished).unwrap();
    std::fs::create_dir(base.join("not a prefix")).unwrap();
    let listing_of = || {
        let output = world
            .consem_command()
            .args(["status", "--json"])
            .arg(format!("--store=local:{}", base.display()))
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
    };
    let listing = listing_of();
    let prefixes: Vec<&str> = listing["semaphores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["prefix"].as_str().unwrap())
        .collect();
    assert_eq!(prefixes, [world.prefix.as_str()], "{listing}");
    assert_eq!(std::fs::read_dir(&unfinished).unwrap().count(), 0);
    world.touch("go");
    assert_eq!(finish(holder).status.code(), Some(0));
    // The prefix's directory stays, idle: not listed.
    assert!(base.join(world.prefix.replace('/', "%2F")).is_dir());
    assert_eq!(listing_of()["semaphores"], serde_json::json!([]));
    world.assert_clean();
}
