//! consem as a well-behaved Unix program: it ignores proxy variables, takes
//! part in job control (Ctrl-Z and `fg`, on a terminal or not), does not hang
//! when started with SIGCHLD ignored, leaves the terminal as it found it when
//! the command cannot start, and says in one short line when --http-addr is
//! not a Consul agent, when the prefix cannot be addressed, or when the prefix
//! holds a `consul lock` mutex. One behaviour per test; deadlines and polling,
//! never sleeps that guess at timing. Nothing here needs the Consul double's
//! fault injection, so every test also runs against a real agent
//! (CONSEM_TEST_CONSUL_ADDR). The job-control tests read process states from
//! /proc and so run on Linux only.

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::pty::spawn_on_terminal;
use crate::common::wait_until;
use crate::common::world::*;

/// `consul lock`'s flag on a mutex's `.lock` (the Go API's `LockFlagValue`).
const MUTEX_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;

// ---- helpers ------------------------------------------------------------

/// A command for consem that writes its pid to `pid` (see `read_pid`) and
/// runs until the test creates `go`, then exits 0.
fn pid_until_go<S>(world: &World<S>, pid: &str, go: &str) -> Vec<String> {
    let script = format!(
        "echo $$ > '{}'; while [ ! -e '{}' ]; do sleep 0.02; done",
        world.path(pid),
        world.path(go)
    );
    vec!["sh".into(), "-c".into(), script]
}

/// True while `pid` exists and is not stopped.
fn is_running(pid: i32) -> bool {
    matches!(process_state(pid), Some(state) if state != 'T')
}

fn send(pid: i32, signal: i32) {
    // SAFETY: kill(2) on a process this test started.
    assert_eq!(
        unsafe { libc::kill(pid, signal) },
        0,
        "kill({pid}, {signal})"
    );
}

fn pid_of(child: &Child) -> i32 {
    i32::try_from(child.id()).unwrap()
}

/// Runs the steps of a test on a running consem; if they panic, kills consem
/// first (SIGKILL ends it even when stopped, and its command dies with it)
/// so that no stopped process outlives the test, and prints `log`.
fn or_kill<T>(
    consem: &mut Child,
    log: impl Fn() -> String,
    steps: impl FnOnce(&mut Child) -> T,
) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| steps(consem))) {
        Ok(value) => value,
        Err(panic) => {
            let _ = consem.kill();
            let _ = consem.wait();
            eprintln!("consem's log:\n{}", log());
            std::panic::resume_unwind(panic);
        }
    }
}

/// Runs `command` to its end with its output captured; it is killed, and the
/// test fails, if it takes longer than `within`.
fn output_within(mut command: Command, within: Duration, what: &str) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_with_deadline(&mut child, within, what);
    child.wait_with_output().unwrap()
}

/// `consem run` against `addr`, with nothing from the environment naming
/// another agent.
fn consem_at(addr: &str, prefix: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_consem"));
    command
        .env_remove("CONSUL_HTTP_ADDR")
        .env_remove("CONSUL_HTTP_TOKEN")
        .env_remove("CONSUL_HTTP_TOKEN_FILE")
        .args([
            "run",
            "--prefix",
            prefix,
            "--limit",
            "1",
            "--http-addr",
            addr,
        ])
        .args(["--", "true"]);
    command
}

/// A loopback address nothing listens on.
fn closed_addr() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// Something at --http-addr that is not a Consul agent: it answers every
/// request with the same bytes, and counts the requests.
struct FakeServer {
    addr: String,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl FakeServer {
    fn answering(response: String) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (counted, stopped) = (Arc::clone(&requests), Arc::clone(&stop));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (response, counted) = (response.clone(), Arc::clone(&counted));
                std::thread::spawn(move || serve_one(stream, response.as_bytes(), &counted));
            }
        });
        FakeServer {
            addr,
            requests,
            stop,
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(&self.addr);
    }
}

/// Reads one request (head, then a Content-Length body), answers it, and
/// closes the connection without resetting it.
fn serve_one(mut stream: TcpStream, response: &[u8], requests: &AtomicUsize) {
    let _ = stream.set_read_timeout(Some(PROMPT));
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut buf) {
            Ok(n @ 1..) => data.extend_from_slice(&buf[..n]),
            _ => return,
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0);
    while data.len() < head_end + length {
        match stream.read(&mut buf) {
            Ok(n @ 1..) => data.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
    requests.fetch_add(1, Ordering::SeqCst);
    let _ = stream.write_all(response);
    let _ = stream.shutdown(Shutdown::Write);
    // Until the client closes: closing with unread data would reset.
    while matches!(stream.read(&mut buf), Ok(1..)) {}
}

// ---- proxies ------------------------------------------------------------

/// Proxy variables are for the command, not for consem: with every one of
/// them naming a closed port (and no NO_PROXY), consem still reaches the agent
/// directly, runs the command and cleans up.
#[test]
fn proxy_variables_are_ignored() {
    let world = World::consul("proxies");
    let proxy = format!("http://{}", closed_addr());
    let mut command = world.consem(1, &[], &["printf", "ran"]);
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        command
            .env(name, &proxy)
            .env(name.to_ascii_lowercase(), &proxy);
    }
    command.env_remove("NO_PROXY").env_remove("no_proxy");
    let output = output_within(command, PROMPT, "consem to run its command");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(output.stdout, b"ran");
    world.assert_clean();
}

// ---- job control --------------------------------------------------------

/// Ctrl-Z in a shell without a terminal of consem's own (stdin is not a
/// terminal) reaches consem as SIGTSTP: the command stops first, then consem;
/// SIGCONT to consem (`fg`) continues both, and the run ends normally.
#[cfg(target_os = "linux")]
#[test]
fn sigtstp_to_consem_stops_the_command_and_sigcont_continues_it() {
    let world = World::consul("tstp-consem");
    let mut consem = spawn_verbose(
        &world,
        1,
        &[],
        &strs(&pid_until_go(&world, "pid", "go")),
        "log",
    );
    let consem_pid = pid_of(&consem);
    let status = or_kill(
        &mut consem,
        || log_text(&world, "log"),
        |consem| {
            let child = read_pid(&world, "pid");
            send(consem_pid, libc::SIGTSTP);
            wait_until(PROMPT, "the command to stop", || is_stopped(child));
            wait_until(PROMPT, "consem to stop", || is_stopped(consem_pid));
            assert!(is_stopped(child), "the command stays stopped with consem");

            send(consem_pid, libc::SIGCONT);
            wait_until(PROMPT, "consem to run again", || is_running(consem_pid));
            wait_until(PROMPT, "the command to run again", || is_running(child));
            world.touch("go");
            wait_with_deadline(consem, PROMPT, "consem to exit")
        },
    );
    assert_eq!(status.code(), Some(0), "{}", log_text(&world, "log"));
    world.assert_clean();
}

/// A command stopped behind consem's back (SIGSTOP to its pid) stops consem
/// too, so that a shell sees the job stop; SIGCONT to consem continues the
/// command as well, and the run ends normally.
#[cfg(target_os = "linux")]
#[test]
fn a_stopped_command_stops_consem_and_sigcont_continues_both() {
    let world = World::consul("stop-child");
    let mut consem = spawn_verbose(
        &world,
        1,
        &[],
        &strs(&pid_until_go(&world, "pid", "go")),
        "log",
    );
    let consem_pid = pid_of(&consem);
    let status = or_kill(
        &mut consem,
        || log_text(&world, "log"),
        |consem| {
            let child = read_pid(&world, "pid");
            send(child, libc::SIGSTOP);
            wait_until(PROMPT, "consem to stop with its command", || {
                is_stopped(consem_pid)
            });
            assert!(is_stopped(child), "the command is still stopped");

            send(consem_pid, libc::SIGCONT);
            wait_until(PROMPT, "consem to run again", || is_running(consem_pid));
            wait_until(PROMPT, "the command to run again", || is_running(child));
            world.touch("go");
            wait_with_deadline(consem, PROMPT, "consem to exit")
        },
    );
    assert_eq!(status.code(), Some(0), "{}", log_text(&world, "log"));
    world.assert_clean();
}

/// On a terminal, Ctrl-Z stops the interactive command (the foreground
/// group); consem stops too, having taken the terminal back first, as a shell
/// expects of a stopped job. `fg` (SIGCONT to consem's group, which owns the
/// terminal) hands the terminal to the command again and continues it: it
/// reads the next line typed and exits 0. consem runs as the session leader
/// of a new pseudo-terminal.
#[cfg(target_os = "linux")]
#[test]
fn ctrl_z_on_a_terminal_stops_consem_with_the_command_and_fg_resumes_it() {
    let world = World::consul("pty-ctrl-z");
    let script = format!(
        "echo $$ > '{}'; echo ready; read line; echo \"got:$line\"",
        world.path("pid")
    );
    let command = world.consem(1, &["-v"], &["sh", "-c", &script]);
    let (mut consem, mut terminal) = spawn_on_terminal(command).expect("a pseudo-terminal");
    let screen = terminal.screen.clone();
    let consem_pid = pid_of(&consem);
    let status = or_kill(
        &mut consem,
        || screen.text(),
        |consem| {
            screen.wait_for("ready");
            let child = read_pid(&world, "pid");
            assert_eq!(
                terminal.foreground_group(),
                child,
                "the command owns the terminal"
            );

            terminal.type_in(b"\x1a");
            wait_until(PROMPT, "the command to stop", || is_stopped(child));
            wait_until(PROMPT, "consem to stop", || is_stopped(consem_pid));
            assert_eq!(
                terminal.foreground_group(),
                consem_pid,
                "consem took the terminal back before stopping"
            );

            // `fg`: the terminal is already consem's group's; continue it.
            // SAFETY: killpg on the group of a process this test started.
            assert_eq!(unsafe { libc::killpg(consem_pid, libc::SIGCONT) }, 0);
            wait_until(PROMPT, "the command to run again", || is_running(child));
            assert!(is_running(consem_pid), "consem runs again");
            assert_eq!(
                terminal.foreground_group(),
                child,
                "the terminal is the command's again"
            );
            terminal.type_in(b"world\n");
            screen.wait_for("got:world");
            wait_with_deadline(consem, PROMPT, "consem to exit")
        },
    );
    assert_eq!(status.code(), Some(0), "terminal:\n{}", screen.text());
    world.assert_clean();
}

/// A command that cannot be started on a terminal (which it takes over in
/// the forked child, before exec fails) leaves the terminal's foreground
/// group as it was: the shell that ran consem can still read from it. The
/// shell is a non-interactive `sh`, the session leader of a new
/// pseudo-terminal, which runs consem in its own process group.
#[cfg(target_os = "linux")]
#[test]
fn a_command_that_cannot_start_leaves_the_terminal_to_the_shell() {
    let world = World::consul("pty-spawn-fail");
    let (mut shell, mut terminal) = script_on_terminal(
        &world,
        "echo ready; read go; \"$@\"; echo \"rc=$?\"; read bye; echo done",
        &["/nonexistent/consem-test"],
    );
    let screen = terminal.screen.clone();
    let shell_pid = pid_of(&shell);
    let status = or_kill(
        &mut shell,
        || screen.text(),
        |shell| {
            screen.wait_for("ready");
            let before = terminal.foreground_group();
            assert_eq!(before, shell_pid, "the shell owns its terminal");
            terminal.type_in(b"go\n");
            screen.wait_for("rc=");
            assert!(screen.text().contains("rc=127"), "{}", screen.text());
            assert_eq!(
                terminal.foreground_group(),
                before,
                "the foreground group is the shell's again"
            );
            terminal.type_in(b"bye\n");
            screen.wait_for("done");
            wait_with_deadline(shell, PROMPT, "the shell to exit")
        },
    );
    assert_eq!(status.code(), Some(0), "terminal:\n{}", screen.text());
    assert!(screen.text().contains("cannot run"), "{}", screen.text());
    world.assert_clean();
}

/// `sh -c SCRIPT` as the session leader of a new terminal, where "$@" in
/// the script runs consem with `command` on the world's store: a shell
/// script without job control, as a user's script runs, so that consem
/// shares its process group with the shell and the script's pipelines.
fn script_on_terminal<S: TestStore>(
    world: &World<S>,
    script: &str,
    command: &[&str],
) -> (Child, crate::common::pty::Terminal) {
    let consem = world.consem(1, &[], command);
    let mut shell = Command::new("sh");
    shell
        .args(["-c", script, "sh"])
        .arg(consem.get_program())
        .args(consem.get_args());
    for (name, value) in consem.get_envs() {
        match value {
            Some(value) => shell.env(name, value),
            None => shell.env_remove(name),
        };
    }
    spawn_on_terminal(shell).expect("a pseudo-terminal")
}

/// `consem run -- producer | pager`: the pager, beside consem in the shell's
/// job, keeps the terminal and reads from it; the producer never needed it.
#[cfg(target_os = "linux")]
#[test]
fn a_pager_after_consem_in_a_pipeline_keeps_the_terminal() {
    let world = World::local("pty-pager-after");
    let producer = format!(
        "echo one; while [ ! -e '{}' ]; do sleep 0.02; done",
        world.path("go")
    );
    let pager = format!(
        "(head -n 1; read x < /dev/tty; echo \"pager got $x\"; touch '{}'; cat > /dev/null)",
        world.path("go")
    );
    let script = format!("\"$@\" | {pager}; echo \"status=$?\"");
    let (mut shell, mut terminal) = script_on_terminal(&world, &script, &["sh", "-c", &producer]);
    let screen = terminal.screen.clone();
    let status = or_kill(
        &mut shell,
        || screen.text(),
        |shell| {
            screen.wait_for("one");
            terminal.type_in(b"hi\n");
            screen.wait_for("pager got hi");
            screen.wait_for("status=0");
            wait_with_deadline(shell, PROMPT, "the script to end")
        },
    );
    assert_eq!(status.code(), Some(0), "terminal:\n{}", screen.text());
    world.assert_clean();
}

/// `producer | consem run -- less`: the command reads the terminal (as a
/// pager reads keys); it gets the terminal when it first tries, and the
/// shell's job has it back afterwards.
#[cfg(target_os = "linux")]
#[test]
fn a_command_in_a_pipeline_that_reads_the_terminal_gets_it() {
    let world = World::local("pty-reader-in-pipeline");
    let reader = format!(
        "cat > /dev/null; touch '{}'; read y < /dev/tty; echo \"command got $y\"",
        world.path("ready")
    );
    let script = "printf 'input\\n' | \"$@\"; echo \"status=$?\"; read z; echo \"shell got $z\"";
    let (mut shell, mut terminal) = script_on_terminal(&world, script, &["sh", "-c", &reader]);
    let screen = terminal.screen.clone();
    let status = or_kill(
        &mut shell,
        || screen.text(),
        |shell| {
            wait_until(PROMPT, "the command to read the terminal", || {
                world.exists("ready")
            });
            terminal.type_in(b"hi\n");
            screen.wait_for("command got hi");
            screen.wait_for("status=0");
            terminal.type_in(b"back\n");
            screen.wait_for("shell got back");
            wait_with_deadline(shell, PROMPT, "the script to end")
        },
    );
    assert_eq!(status.code(), Some(0), "terminal:\n{}", screen.text());
    world.assert_clean();
}

/// Ctrl-C in a script that loops over consem stops the script, as it does
/// a loop over `sleep`: the shell gets the SIGINT too, and consem dies of
/// it once its command has.
#[cfg(target_os = "linux")]
#[test]
fn ctrl_c_stops_a_script_that_loops_over_consem() {
    let world = World::local("pty-ctrl-c-loop");
    let command = format!("touch '{}'; exec sleep 30", world.path("ready"));
    let script = "for i in 1 2 3; do \"$@\"; echo \"next $i\"; done; echo end";
    let (mut shell, mut terminal) = script_on_terminal(&world, script, &["sh", "-c", &command]);
    let screen = terminal.screen.clone();
    let status = or_kill(
        &mut shell,
        || screen.text(),
        |shell| {
            wait_until(PROMPT, "the first command to start", || {
                world.exists("ready")
            });
            terminal.type_in(b"\x03");
            wait_with_deadline(shell, PROMPT, "the script to stop")
        },
    );
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(
        status.signal(),
        Some(libc::SIGINT),
        "terminal:\n{}",
        screen.text()
    );
    assert!(!screen.text().contains("next"), "{}", screen.text());
    world.assert_clean();
}

/// `nohup consem run ...` in the foreground of a terminal that closes: the
/// hang-up (SIGHUP to the session's leader, consem here, and to the
/// terminal's foreground group, the command's) ends neither, as it ends
/// neither `nohup flock` nor its command.
#[cfg(target_os = "linux")]
#[test]
fn nohup_survives_the_terminal_s_close() {
    let world = World::local("pty-nohup");
    let command = format!(
        "touch '{}'; while [ ! -e '{}' ]; do sleep 0.02; done; touch '{}'",
        world.path("ready"),
        world.path("go"),
        world.path("finished")
    );
    let consem = world.consem(1, &[], &["sh", "-c", &command]);
    let mut nohup = Command::new("nohup");
    nohup
        .arg(consem.get_program())
        .args(consem.get_args())
        .current_dir(&world.dir);
    let (mut consem, terminal) = spawn_on_terminal(nohup).expect("a pseudo-terminal");
    let screen = terminal.screen.clone();
    let consem_pid = pid_of(&consem);
    let status = or_kill(
        &mut consem,
        || screen.text(),
        |consem| {
            wait_until(PROMPT, "the command to start", || world.exists("ready"));
            let foreground = terminal.foreground_group();
            // What the kernel sends when the terminal goes away.
            for target in [consem_pid, -foreground] {
                // SAFETY: kill(2) with a pid or a group of this test's own.
                unsafe {
                    libc::kill(target, libc::SIGHUP);
                    libc::kill(target, libc::SIGCONT);
                }
            }
            world.touch("go");
            wait_with_deadline(consem, PROMPT, "consem to exit")
        },
    );
    assert_eq!(status.code(), Some(0), "terminal:\n{}", screen.text());
    assert!(world.exists("finished"), "the command ran to its end");
    world.assert_clean();
}

/// A parent that ignores SIGCHLD passes that on through exec; consem puts it
/// back to the default, so that it can still wait for its command: the
/// command's exit status comes back, promptly.
#[test]
fn sigchld_ignored_by_the_parent_still_passes_the_exit_status_on() {
    let world = World::consul("sigchld-ignored");
    let mut command = world.consem(1, &[], &["sh", "-c", "exit 5"]);
    // SAFETY: signal is async-signal-safe and takes no pointers.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGCHLD, libc::SIG_IGN);
            Ok(())
        });
    }
    let output = output_within(command, PROMPT, "consem to exit with its command");
    assert_eq!(output.status.code(), Some(5), "{}", stderr(&output));
    world.assert_clean();
}

// ---- something else at --http-addr --------------------------------------

/// An HTTP server that is not Consul (a 404 without X-Consul-Index) at
/// --http-addr: consem gives up at once with 69 and one line that asks
/// whether the address is a Consul agent's.
#[test]
fn a_non_consul_server_exits_69_naming_the_consul_agent() {
    let server = FakeServer::answering(
        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into(),
    );
    let output = output_within(
        consem_at(&server.addr, "not-consul"),
        PROMPT,
        "consem to give up",
    );
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    let message = stderr(&output);
    assert_eq!(message.lines().count(), 1, "one line: {message}");
    assert!(message.contains("Consul agent"), "{message}");
    assert!(server.requests() >= 1, "consem asked the server");
}

/// A proxy's HTML error page (502, many lines, long) becomes one short line
/// in consem's error; it exits 69.
#[test]
fn an_html_error_page_becomes_one_short_line() {
    let mut page = String::from(
        "<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n",
    );
    for i in 0..40 {
        page.push_str(&format!(
            "  <p>upstream connect error or disconnect/reset before headers {i}</p>\n"
        ));
    }
    page.push_str("</body>\n</html>\n");
    let server = FakeServer::answering(format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
        page.len()
    ));
    let output = output_within(
        consem_at(&server.addr, "behind-a-proxy"),
        PROMPT,
        "consem to give up",
    );
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    let message = stderr(&output);
    assert_eq!(message.lines().count(), 1, "one line: {message}");
    assert!(message.ends_with('\n'), "{message:?}");
    assert!(
        message.chars().count() <= 400,
        "{} chars: {message}",
        message.chars().count()
    );
    assert!(message.contains("502"), "{message}");
    assert!(server.requests() >= 1, "consem asked the server");
}

// ---- prefixes and foreign records -----------------------------------------

/// Consul's HTTP server redirects paths with empty, `.` or `..` segments, so
/// such a prefix is a usage error: 2, one line naming the segment problem,
/// and no request at all (the address is a closed port, which would be 69).
#[test]
fn prefixes_with_empty_dot_or_dot_dot_segments_are_usage_errors() {
    let addr = closed_addr();
    for prefix in ["a//b", "a/./b", "a/../b", "./a", "a/.."] {
        let output = output_within(consem_at(&addr, prefix), PROMPT, "consem to refuse");
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{prefix}: {message}");
        assert_eq!(message.lines().count(), 1, "{prefix}: one line: {message}");
        assert!(message.contains("segment"), "{prefix}: {message}");
        assert!(message.contains(prefix), "{prefix}: {message}");
    }
}

/// `consul lock` without -n keeps a mutex at `<prefix>/.lock`: held by its
/// session, with the Lock flag. consem exits 65 saying so, and leaves the
/// key exactly as it was (value, flags, session, indexes).
#[test]
fn a_consul_lock_mutex_is_a_conflict_and_stays_untouched() {
    let world = World::consul("mutex");
    let session = peer_session(&world, &format!("consul lock {}", world.prefix));
    let url = format!(
        "http://{}/v1/kv/{}?acquire={session}&flags={MUTEX_FLAGS}",
        world.store.addr(),
        crate::common::encode_key(&world.key(".lock"))
    );
    let (status, body) = crate::common::http("PUT", &url, b"");
    assert_eq!((status, body.trim()), (200, "true"));
    let before = world.entries();
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(before[0].flags, MUTEX_FLAGS);
    assert_eq!(before[0].session.as_deref(), Some(session.as_str()));

    let output = output_within(world.consem(1, &[], &["true"]), PROMPT, "consem to refuse");
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(65), "{message}");
    assert_eq!(message.lines().count(), 1, "one line: {message}");
    assert!(message.contains("consul lock"), "{message}");
    assert!(message.contains(".lock"), "{message}");
    assert_eq!(world.entries(), before, ".lock changed");

    world.store.destroy_session(&session);
    world.store.delete_tree(&format!("{}/", world.prefix));
    world.assert_clean();
}

/// A reader that went away before consem printed (`consem status | true`,
/// `consem completions bash | head -0`) ends consem by SIGPIPE, as it ends
/// `cat`: no panic, no message, nothing for a shell's `pipefail` but 141.
#[test]
fn printing_into_a_closed_pipe_ends_consem_by_sigpipe_without_a_word() {
    use std::os::unix::process::ExitStatusExt as _;
    let world = World::local("closed-pipe");
    let prefix = world.prefix.clone();
    for (args, on_the_store) in [
        (vec!["completions", "bash"], false),
        (vec!["status", "--prefix", prefix.as_str()], true),
    ] {
        // The reader is gone before consem starts: its first print fails.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut command = world.consem_command();
        command.args(&args);
        if on_the_store {
            world.store.point(&mut command);
        }
        let mut child = command
            .stdout(writer)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The command's copy of the writer must not keep the pipe open.
        drop(command);
        wait_with_deadline(
            &mut child,
            Duration::from_secs(30),
            "consem into a closed pipe",
        );
        let output = child.wait_with_output().unwrap();
        assert_eq!(
            output.status.signal(),
            Some(libc::SIGPIPE),
            "consem {args:?} into a closed pipe ended with {} and said {:?}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.stderr.is_empty(),
            "consem {args:?} said {:?}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
