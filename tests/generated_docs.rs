//! The committed shell completions (completions/) and man pages (docs/man/)
//! must be exactly what the current command line generates.
//!
//! Completions are taken from the real binary (`consem completions <SHELL>`),
//! so what is checked is what users get; man pages are rendered with
//! clap_mangen from `Cli::command()`, one page for consem and one per
//! subcommand (consem-run.1, ...), as `clap_mangen::generate_to` names them.
//!
//! To refresh the committed files after changing the command line:
//!
//! ```text
//! CONSEM_BLESS=1 cargo test --test suite generated_docs::
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{CommandFactory as _, ValueEnum as _};
use clap_complete::{Generator as _, Shell};
use consem::cli::Cli;

const BIN_NAME: &str = "consem";
const COMPLETIONS_DIR: &str = "completions";
const MAN_DIR: &str = "docs/man";
const SOURCE: &str = concat!("consem ", env!("CARGO_PKG_VERSION"));
const BLESS_HINT: &str = "CONSEM_BLESS=1 cargo test --test suite generated_docs::";

/// A file as it should be committed, relative to the crate root.
struct Generated {
    path: PathBuf,
    contents: Vec<u8>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What `consem completions <shell>` prints, for every shell clap_complete knows.
fn completions() -> Vec<Generated> {
    Shell::value_variants()
        .iter()
        .map(|shell| {
            let output = Command::new(env!("CARGO_BIN_EXE_consem"))
                .arg("completions")
                .arg(shell.to_string())
                .output()
                .expect("run consem completions");
            assert!(
                output.status.success(),
                "consem completions {shell} failed with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(
                output.stderr.is_empty(),
                "consem completions {shell} wrote on stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(
                !output.stdout.is_empty(),
                "consem completions {shell} printed nothing"
            );
            Generated {
                path: Path::new(COMPLETIONS_DIR).join(shell.file_name(BIN_NAME)),
                contents: output.stdout,
            }
        })
        .collect()
}

/// The man pages, as `clap_mangen::generate_to` would write them: no help
/// subcommand, hidden subcommands skipped, subcommands named `consem-<sub>`.
/// No date is set, so the output does not depend on when it is generated.
/// Each page's footer says "consem <version>".
fn man_pages() -> Vec<Generated> {
    fn render(cmd: clap::Command, pages: &mut Vec<Generated>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            render(sub, pages);
        }
        // Every page's footer names the package, not the subcommand.
        let man = clap_mangen::Man::new(cmd).source(SOURCE);
        let mut contents = Vec::new();
        man.render(&mut contents).expect("render man page");
        pages.push(Generated {
            path: Path::new(MAN_DIR).join(man.get_filename()),
            contents,
        });
    }

    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    render(cmd, &mut pages);
    pages.sort_by(|a, b| a.path.cmp(&b.path));
    pages
}

/// Files in `dir` (relative to the crate root) that nothing generates.
fn strays(dir: &str, generated: &[Generated]) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root().join(dir)) else {
        return Vec::new();
    };
    let mut strays: Vec<PathBuf> = entries
        .map(|entry| Path::new(dir).join(entry.expect("read directory entry").file_name()))
        .filter(|path| !generated.iter().any(|g| &g.path == path))
        .collect();
    strays.sort();
    strays
}

fn bless_requested() -> bool {
    std::env::var_os("CONSEM_BLESS").is_some_and(|v| !v.is_empty() && v != "0")
}

#[test]
fn committed_completions_and_man_pages_are_current() {
    let completions = completions();
    let man_pages = man_pages();

    let names: Vec<String> = man_pages
        .iter()
        .map(|g| g.path.display().to_string())
        .collect();
    for expected in [
        "docs/man/consem.1",
        "docs/man/consem-run.1",
        "docs/man/consem-status.1",
        "docs/man/consem-release.1",
        "docs/man/consem-reset.1",
        "docs/man/consem-completions.1",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} is not generated; generated: {names:?}"
        );
    }

    let mut stray = strays(COMPLETIONS_DIR, &completions);
    stray.extend(strays(MAN_DIR, &man_pages));
    let generated: Vec<Generated> = completions.into_iter().chain(man_pages).collect();

    if bless_requested() {
        for file in &generated {
            let path = root().join(&file.path);
            std::fs::create_dir_all(path.parent().expect("a parent directory"))
                .expect("create directory");
            std::fs::write(&path, &file.contents).expect("write generated file");
        }
        for path in &stray {
            std::fs::remove_file(root().join(path)).expect("remove stray file");
        }
        return;
    }

    let mut problems = Vec::new();
    for file in &generated {
        match std::fs::read(root().join(&file.path)) {
            Ok(committed) if committed == file.contents => {}
            Ok(_) => problems.push(format!(
                "{} differs from what the current command line generates",
                file.path.display()
            )),
            Err(err) => problems.push(format!("{} cannot be read: {err}", file.path.display())),
        }
    }
    for path in &stray {
        problems.push(format!(
            "{} is not generated any more (a removed shell or subcommand?)",
            path.display()
        ));
    }
    assert!(
        problems.is_empty(),
        "generated completions or man pages are stale:\n  {}\nRefresh them with:\n  {BLESS_HINT}\nand commit the result.",
        problems.join("\n  ")
    );
}
