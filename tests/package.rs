//! The Debian package that scripts/deb builds installs what docs/install.md
//! says: the binary in /usr/bin, every man page compressed in man1, the
//! completions where bash, zsh and fish look for them and the licenses,
//! nothing else, all owned by root; its control fields are dpkg's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::world::World;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// What the package installs: each file with its mode, from the committed
/// file it must hold (None for the binary).
fn promised() -> BTreeMap<String, (&'static str, Option<PathBuf>)> {
    let mut files = BTreeMap::new();
    files.insert("./usr/bin/consem".to_string(), ("-rwxr-xr-x", None));
    let mut pages = 0;
    for entry in std::fs::read_dir(root().join("docs/man")).unwrap() {
        let page = entry.unwrap().path();
        let name = page.file_name().unwrap().to_str().unwrap().to_string();
        files.insert(
            format!("./usr/share/man/man1/{name}.gz"),
            ("-rw-r--r--", Some(page)),
        );
        pages += 1;
    }
    assert!(pages >= 6, "consem(1) and one page per subcommand");
    for (installed, committed) in [
        (
            "./usr/share/bash-completion/completions/consem",
            "completions/consem.bash",
        ),
        (
            "./usr/share/zsh/vendor-completions/_consem",
            "completions/_consem",
        ),
        (
            "./usr/share/fish/vendor_completions.d/consem.fish",
            "completions/consem.fish",
        ),
    ] {
        files.insert(
            installed.to_string(),
            ("-rw-r--r--", Some(root().join(committed))),
        );
    }
    // The reference --help and the man pages name (docs/run.md, ...).
    files.insert(
        "./usr/share/doc/consem/README.md.gz".to_string(),
        ("-rw-r--r--", Some(root().join("README.md"))),
    );
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let page = entry.unwrap().path();
        if page.extension().is_some_and(|e| e == "md") {
            let name = page.file_name().unwrap().to_str().unwrap().to_string();
            files.insert(
                format!("./usr/share/doc/consem/docs/{name}.gz"),
                ("-rw-r--r--", Some(page)),
            );
        }
    }
    for doc in ["copyright", "changelog.gz"] {
        files.insert(
            format!("./usr/share/doc/consem/{doc}"),
            ("-rw-r--r--", None),
        );
    }
    files
}

#[test]
fn the_debian_package_installs_the_binary_man_pages_and_completions() {
    let world = World::without_store("deb");
    let built = run(Command::new(root().join("scripts/deb"))
        .arg(env!("CARGO_BIN_EXE_consem"))
        .arg(&world.dir)
        .env("DEBFULLNAME", "Fleet Operators")
        .env("DEBEMAIL", "ops@example.org"));
    let package = PathBuf::from(built.trim());
    // The same sources build the same bytes (dates from the last commit).
    let again = run(Command::new(root().join("scripts/deb"))
        .arg(env!("CARGO_BIN_EXE_consem"))
        .arg(world.dir.join("again"))
        .env("DEBFULLNAME", "Fleet Operators")
        .env("DEBEMAIL", "ops@example.org"));
    assert!(
        read(&package) == read(Path::new(again.trim())),
        "two builds of the same sources differ: {} and {}",
        package.display(),
        again.trim()
    );
    let arch = run(Command::new("dpkg").arg("--print-architecture"));
    assert_eq!(
        package.file_name().unwrap().to_str().unwrap(),
        format!("consem_{}_{}.deb", env!("CARGO_PKG_VERSION"), arch.trim())
    );

    // dpkg-deb -c: mode, owner, size, date, time, path.
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(&package));
    let mut files = BTreeMap::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[1], "root/root", "{line}");
        if !fields[0].starts_with('d') {
            files.insert(fields[5].to_string(), fields[0].to_string());
        }
    }
    let promised = promised();
    let modes: BTreeMap<String, String> = promised
        .iter()
        .map(|(path, (mode, _))| (path.clone(), mode.to_string()))
        .collect();
    assert_eq!(files, modes, "what the package installs, and its modes");

    // dpkg-deb -I: the control fields.
    let info = run(Command::new("dpkg-deb").arg("-I").arg(&package));
    let field = |name: &str| -> String {
        info.lines()
            .find_map(|line| line.trim_start().strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in\n{info}"))
            .to_string()
    };
    assert_eq!(field("Package"), "consem");
    assert_eq!(field("Version"), env!("CARGO_PKG_VERSION"));
    assert_eq!(field("Architecture"), arch.trim());
    assert_eq!(field("Maintainer"), "Fleet Operators <ops@example.org>");
    assert!(info.contains(" md5sums "), "{info}");
    assert!(field("Depends").contains("libc6 (>= "), "{info}");
    assert_eq!(field("Section"), "utils");

    // The files hold what is committed, and the binary runs.
    let unpacked = world.dir.join("unpacked");
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&package)
        .arg(&unpacked));
    for (path, (_, committed)) in &promised {
        let Some(committed) = committed else { continue };
        let installed = unpacked.join(path);
        let held = if path.ends_with(".gz") {
            run(Command::new("gzip").arg("-dc").arg(&installed)).into_bytes()
        } else {
            read(&installed)
        };
        assert!(
            held == read(committed),
            "{path} is not {}",
            committed.display()
        );
    }
    let version = run(Command::new(unpacked.join("usr/bin/consem")).arg("--version"));
    assert_eq!(
        version.trim(),
        format!("consem {}", env!("CARGO_PKG_VERSION"))
    );
    let copyright =
        String::from_utf8(read(&unpacked.join("usr/share/doc/consem/copyright"))).unwrap();
    assert!(
        copyright.contains("License: MIT or Apache-2.0"),
        "{copyright}"
    );
    assert!(
        copyright.contains("/usr/share/common-licenses/Apache-2.0"),
        "{copyright}"
    );
    assert!(
        copyright.contains(" Permission is hereby granted, free of charge"),
        "{copyright}"
    );
}
