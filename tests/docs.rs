//! The documentation tells the truth: every relative link in README.md and
//! docs/*.md leads to a file, and to one of its headings when it names one
//! (by GitHub's anchor rules); README stays a front page; and README's quick
//! start on the local store runs as written and shows what README shows.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::local::assert_local_clean;
use crate::common::pty::{spawn_on_terminal_sized, Screen};
use crate::common::wait_until;
use crate::common::world::{wait_with_deadline, World, PROMPT};

/// README is the front page; the reference lives in docs/.
const README_MAX_LINES: usize = 250;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// README.md and every page of docs/.
fn documents() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    pages.insert(0, root().join("README.md"));
    pages
}

/// The lines of a Markdown text outside fenced code blocks, numbered from 1.
fn prose_lines(markdown: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (index, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// A heading's text as GitHub renders it: code spans lose their backticks,
/// links keep their text, emphasis loses its stars.
fn rendered(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('[') {
        let Some(middle) = rest[start..].find("](") else {
            break;
        };
        let Some(end) = rest[start + middle..].find(')') else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push_str(&rest[start + 1..start + middle]);
        rest = &rest[start + middle + end + 1..];
    }
    out.push_str(rest);
    out.replace(['`', '*'], "")
}

/// GitHub's anchor for a heading: lower case, every character that is not
/// a letter, a digit, a space, `-` or `_` dropped, spaces made `-`.
fn anchor(heading: &str) -> String {
    rendered(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings; a repeated one gets `-1`, `-2`, ...
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose_lines(markdown) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = anchor(&line[hashes..]);
        let mut unique = base.clone();
        let mut count = 0;
        while seen.contains(&unique) {
            count += 1;
            unique = format!("{base}-{count}");
        }
        seen.insert(unique);
    }
    seen
}

/// The targets of a page's inline links (`[text](target)`), with their line,
/// outside code blocks and code spans; links to other sites left out.
fn relative_links(markdown: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    for (number, line) in prose_lines(markdown) {
        // Code spans are the odd-numbered pieces between backticks.
        let prose: String = line
            .split('`')
            .enumerate()
            .map(|(i, piece)| if i % 2 == 0 { piece } else { "" })
            .collect();
        let mut rest = prose.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                links.push((number, target.to_string()));
            }
            rest = &after[end..];
        }
    }
    links
}

/// What is wrong with the relative links of `page`: each missing file or
/// heading, named with its line.
fn broken_links(page: &Path, markdown: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for (line, target) in relative_links(markdown) {
        let (file, heading) = match target.split_once('#') {
            Some((file, heading)) => (file, Some(heading)),
            None => (target.as_str(), None),
        };
        let linked = if file.is_empty() {
            page.to_path_buf()
        } else {
            page.parent().unwrap().join(file)
        };
        let at = format!("{}:{line}: ({target})", page.display());
        if !linked.exists() {
            broken.push(format!("{at}: no file {}", linked.display()));
            continue;
        }
        if let Some(heading) = heading {
            let is_markdown = linked.extension().is_some_and(|ext| ext == "md");
            let headings = if file.is_empty() {
                anchors(markdown)
            } else if is_markdown {
                anchors(&read(&linked))
            } else {
                BTreeSet::new()
            };
            if !headings.contains(heading) {
                broken.push(format!(
                    "{at}: no heading #{heading} in {}",
                    linked.display()
                ));
            }
        }
    }
    broken
}

#[test]
fn anchors_are_github_s() {
    assert_eq!(anchor(" `consem run`"), "consem-run");
    assert_eq!(
        anchor(" Redis: the cost of `--redis-wait-replicas`"),
        "redis-the-cost-of---redis-wait-replicas"
    );
    assert_eq!(
        anchor(" Beside [`consul lock`](consul.md): mixed clients"),
        "beside-consul-lock-mixed-clients"
    );
    assert_eq!(anchor(" Exit codes"), "exit-codes");
    let page = "# A\n\n```sh\n# not a heading\n```\n## A\n## Why, *and* how\n";
    assert_eq!(
        anchors(page),
        BTreeSet::from([
            "a".to_string(),
            "a-1".to_string(),
            "why-and-how".to_string()
        ])
    );
}

#[test]
fn a_link_to_a_missing_file_or_heading_is_found() {
    let page = root().join("docs").join("run.md");
    let markdown = "[ok](../README.md#install) [gone](nosuch.md) `[code](nosuch.md)`\n\
                    [nowhere](#no-such-heading) [web](https://example.com/x.md)\n\
                    ## Here\n[here](#here)\n";
    let broken = broken_links(&page, markdown);
    assert_eq!(broken.len(), 2, "{broken:#?}");
    assert!(broken[0].contains("(nosuch.md): no file"), "{broken:#?}");
    assert!(
        broken[1].contains("no heading #no-such-heading"),
        "{broken:#?}"
    );
}

#[test]
fn every_relative_link_leads_to_a_file_and_heading() {
    let mut broken = Vec::new();
    for page in documents() {
        broken.extend(broken_links(&page, &read(&page)));
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn readme_is_a_front_page() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move reference to docs/"
    );
}

const QUICK_START_BEGIN: &str = "<!-- quick start, local store";
const QUICK_START_END: &str = "<!-- end of the quick start -->";
/// The host README's examples show.
const README_HOST: &str = "laptop";

/// README's local quick start: its code blocks (indented four spaces), each
/// as its lines without the indentation.
fn quick_start_blocks() -> Vec<Vec<String>> {
    let readme = read(&root().join("README.md"));
    let begin = readme
        .find(QUICK_START_BEGIN)
        .expect("README marks its local quick start");
    let end = begin
        + readme[begin..]
            .find(QUICK_START_END)
            .expect("README marks the end of its local quick start");
    let mut blocks: Vec<Vec<String>> = Vec::new();
    let mut in_block = false;
    for line in readme[begin..end].lines().skip(1) {
        if let Some(code) = line.strip_prefix("    ") {
            if !in_block {
                blocks.push(Vec::new());
                in_block = true;
            }
            blocks.last_mut().unwrap().push(code.to_string());
        } else if line.trim().is_empty() {
            // A blank line stays in a block if more code follows it.
            if in_block {
                blocks.last_mut().unwrap().push(String::new());
            }
        } else {
            in_block = false;
        }
    }
    for block in &mut blocks {
        while block.last().is_some_and(String::is_empty) {
            block.pop();
        }
    }
    blocks
}

/// A line as this test compares it: the host named as README names it,
/// every number `N` (pids, times, ticket numbers), runs of blanks one space.
fn comparable(line: &str, host: &str) -> String {
    let mut named = String::new();
    let mut rest = line;
    let is_name_char = |c: char| c.is_alphanumeric() || matches!(c, '-' | '.' | '_');
    while let Some(at) = rest.find(host) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + host.len()..].chars().next();
        named.push_str(&rest[..at]);
        if before.is_some_and(is_name_char) || after.is_some_and(is_name_char) {
            named.push_str(host);
        } else {
            named.push_str(README_HOST);
        }
        rest = &rest[at + host.len()..];
    }
    named.push_str(rest);
    let mut out = String::new();
    for c in named.chars() {
        let last = out.chars().next_back();
        if c.is_ascii_digit() {
            if last != Some('N') {
                out.push('N');
            }
        } else if c.is_whitespace() {
            if last != Some(' ') {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
    }
    out.trim().to_string()
}

fn hostname() -> String {
    read(Path::new("/proc/sys/kernel/hostname"))
        .trim()
        .to_string()
}

/// The rows a terminal shows that are not blank.
fn shown_lines(screen: &Screen) -> Vec<String> {
    screen
        .rows()
        .into_iter()
        .filter(|line| !line.is_empty())
        .collect()
}

/// Runs one of README's commands as written, with sh, after the exports
/// README gave before it.
fn shell(exports: &[String], command: &str) -> Command {
    let consem = PathBuf::from(env!("CARGO_BIN_EXE_consem"));
    let path = format!(
        "{}:{}",
        consem.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut script = exports.join("\n");
    script.push('\n');
    script.push_str(command);
    let mut sh = Command::new("sh");
    sh.arg("-c").arg(script).env("PATH", path);
    sh.env_remove("CONSEM_STORE").stdin(Stdio::null());
    sh
}

/// The pids of the consems that hold a slot of `prefix`, as `status --json`
/// gives them.
fn holder_pids(exports: &[String], store: &str, prefix: &str) -> Vec<i32> {
    let output = shell(
        exports,
        &format!("consem status --store {store} --prefix {prefix} --json"),
    )
    .output()
    .unwrap();
    let Ok(status) = serde_json::from_slice::<serde_json::Value>(&output.stdout) else {
        return Vec::new();
    };
    status["holders"].as_array().map_or(Vec::new(), |holders| {
        holders
            .iter()
            .map(|holder| holder["pid"].as_i64().unwrap() as i32)
            .collect()
    })
}

/// Process groups that this test started, killed when it ends, so that a
/// failing run leaves no copy behind (a consem SIGKILLed takes its command
/// with it).
struct Groups(Vec<i32>);

impl Drop for Groups {
    fn drop(&mut self) {
        for &group in &self.0 {
            // SAFETY: kill(2) takes no pointers; a group that is gone gives ESRCH.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
    }
}

/// Ends a holder as its command ending would (SIGTERM, passed on to it).
fn stop(pid: i32) {
    // SAFETY: kill(2) takes no pointers; the pid is a consem this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
}

/// README's quick start, three copies at limit 2 on the local store: two
/// take the slots in the background, the third waits on a terminal and
/// shows README's waiting line, `consem status` (from "another terminal")
/// shows README's table, and the third runs once a slot frees, printing
/// README's fence. The store is a scratch directory (`local` becomes
/// `local:<dir>`); hosts, pids, times and numbers are compared as `N`.
#[test]
fn the_local_quick_start_runs_as_written() {
    let blocks = quick_start_blocks();
    let shape = "the quick start is a session (two commands in the background, a `sleep` \
                 for them to start, one in the foreground and its waiting line), `consem \
                 status` and its \
                 output, then what the foreground command prints; tests/docs.rs follows \
                 that shape";
    assert_eq!(blocks.len(), 3, "{shape}: {blocks:#?}");
    let world = World::local("quick-start");
    let store = format!("local:{}", world.store.base.display());
    let as_run = |command: &str| {
        command
            .replace("CONSEM_STORE=local", &format!("CONSEM_STORE={store}"))
            .replace("--store local ", &format!("--store {store} "))
    };
    let host = hostname();

    let session = &blocks[0];
    let commands: Vec<&str> = session
        .iter()
        .filter_map(|line| line.strip_prefix("$ "))
        .collect();
    let foreground = *commands.last().expect(shape);
    let foreground_at = session.iter().position(|l| l == &format!("$ {foreground}"));
    let waiting_line = &session[foreground_at.unwrap() + 1..];
    assert_eq!(waiting_line.len(), 1, "{shape}: {session:#?}");
    let exports: Vec<String> = commands
        .iter()
        .filter(|c| c.starts_with("export "))
        .map(|c| as_run(c))
        .collect();
    let background: Vec<&str> = commands
        .iter()
        .filter_map(|c| c.strip_suffix(" &"))
        .collect();
    // A reader's pause for the two to start: the test waits for each
    // instead, by polling.
    let pauses = commands.iter().filter(|c| c.starts_with("sleep ")).count();
    assert_eq!(
        exports.len() + background.len() + pauses + 1,
        commands.len(),
        "{shape}: {commands:#?}"
    );
    let prefix = foreground
        .split_whitespace()
        .skip_while(|word| *word != "--prefix")
        .nth(1)
        .expect("the quick start names its prefix");

    let mut holders: Vec<Child> = Vec::new();
    let mut groups = Groups(Vec::new());
    for (count, command) in background.iter().enumerate() {
        let holder = shell(&exports, &as_run(command))
            .process_group(0)
            .spawn()
            .unwrap();
        groups.0.push(holder.id() as i32);
        holders.push(holder);
        wait_until(PROMPT, &format!("{command:?} to hold a slot"), || {
            holder_pids(&exports, &store, prefix).len() == count + 1
        });
    }

    // A terminal wide enough for the whole line, as README shows it.
    let (mut waiter, terminal) =
        spawn_on_terminal_sized(shell(&exports, &as_run(foreground)), 250, 24)
            .expect("a pseudo-terminal");
    groups.0.push(waiter.id() as i32);
    let wanted = comparable(&waiting_line[0], README_HOST);
    let deadline = Instant::now() + PROMPT;
    while !shown_lines(&terminal.screen)
        .iter()
        .any(|line| comparable(line, &host) == wanted)
    {
        assert!(
            Instant::now() < deadline,
            "README's waiting line\n  {wanted}\nnot shown within {PROMPT:?}; the terminal shows:\n{:#?}",
            shown_lines(&terminal.screen)
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let status_block = &blocks[1];
    let status_command = status_block[0]
        .strip_prefix("$ ")
        .unwrap_or_else(|| panic!("{shape}: {status_block:#?}"));
    let status = shell(&[], &as_run(status_command)).output().unwrap();
    assert_eq!(status.status.code(), Some(0), "{status:?}");
    let shown: Vec<String> = String::from_utf8_lossy(&status.stdout)
        .lines()
        .map(|line| comparable(line, &host))
        .collect();
    let documented: Vec<String> = status_block[1..]
        .iter()
        .map(|line| comparable(line, README_HOST))
        .collect();
    assert_eq!(
        shown, documented,
        "`{status_command}` shows what README shows"
    );

    // The first holder ends (its `sleep` stopped early, not waited for):
    // the third takes the slot.
    stop(holder_pids(&exports, &store, prefix)[0]);
    let ended = wait_with_deadline(&mut waiter, PROMPT, "the third copy to run");
    assert_eq!(ended.code(), Some(0), "{:?}", terminal.screen.text());
    terminal.screen.wait_closed();
    let printed: Vec<String> = shown_lines(&terminal.screen)
        .into_iter()
        .filter(|line| !line.starts_with("waiting for a slot"))
        .collect();
    assert_eq!(
        printed, blocks[2],
        "the third copy prints what README shows"
    );
    for pid in holder_pids(&exports, &store, prefix) {
        stop(pid);
    }
    for mut holder in holders {
        wait_with_deadline(&mut holder, PROMPT, "a background copy to stop");
    }
    assert_local_clean(&world.store.base);
}
