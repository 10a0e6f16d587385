//! The local store in a directory of a world's own.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::world::TestStore;

/// The local store's base directory (`--store local:<base>`); each prefix
/// gets a directory in it.
pub struct LocalStore {
    pub base: PathBuf,
}

impl TestStore for LocalStore {
    const NAME: &'static str = "local";
    const HAS_LEASE: bool = false;

    fn point(&self, command: &mut Command) {
        command.arg(format!("--store=local:{}", self.base.display()));
    }

    /// Contender files, in every prefix's directory (the world has one).
    fn contenders(&self, _prefix: &str) -> usize {
        let Ok(prefixes) = std::fs::read_dir(&self.base) else {
            return 0;
        };
        prefixes
            .flat_map(|p| std::fs::read_dir(p.unwrap().path()).unwrap())
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".c")
            })
            .count()
    }

    fn assert_clean(&self, _prefix: &str) {
        assert_local_clean(&self.base);
    }
}

/// The local store keeps, per prefix, only its `meta` lock file and its
/// `state` record (the fence survives); no contender file, no holder, no
/// limit once everyone left.
pub fn assert_local_clean(base: &Path) {
    let Ok(prefixes) = std::fs::read_dir(base) else {
        return;
    };
    for prefix in prefixes {
        let dir = prefix.unwrap().path();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert!(
            names.iter().all(|n| n == "meta" || n == "state"),
            "files left in {}: {names:?}",
            dir.display()
        );
        if let Ok(state) = std::fs::read(dir.join("state")) {
            let state: serde_json::Value = serde_json::from_slice(&state).unwrap();
            assert_eq!(state["holders"], serde_json::json!([]), "{state}");
            assert_eq!(state["limit"], serde_json::Value::Null, "{state}");
        }
    }
}
