//! Cargo.toml tells the truth: `rust-version` is the highest `rust-version`
//! among the locked dependencies a build of consem needs (the tests' own
//! dependencies aside), so `cargo install --locked` works with it.

use std::collections::{BTreeMap, BTreeSet};

fn version(text: &str) -> Vec<u32> {
    text.split('.')
        .map(|part| part.parse().unwrap_or(0))
        .collect()
}

#[test]
fn rust_version_is_the_true_minimum_of_the_locked_dependencies() {
    let output = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let packages: BTreeMap<&str, &serde_json::Value> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p))
        .collect();
    let nodes: BTreeMap<&str, &serde_json::Value> = metadata["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let root = metadata["resolve"]["root"].as_str().unwrap();
    // Walk the normal dependencies (not dev, not build of the root's tests).
    let mut seen = BTreeSet::new();
    let mut stack = vec![root];
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null() || k["kind"] == "build");
            if normal {
                stack.push(dep["pkg"].as_str().unwrap());
            }
        }
    }
    let (needed, by) = seen
        .iter()
        .filter(|id| **id != root)
        .filter_map(|id| {
            let p = packages[id];
            p["rust_version"]
                .as_str()
                .map(|v| (version(v), p["name"].as_str().unwrap()))
        })
        .max()
        .unwrap();
    let declared = version(
        packages[root]["rust_version"]
            .as_str()
            .expect("rust-version is set"),
    );
    let trimmed = |v: &[u32]| v.iter().take(2).copied().collect::<Vec<_>>();
    assert_eq!(
        trimmed(&declared),
        trimmed(&needed),
        "Cargo.toml's rust-version is {declared:?}, the locked dependencies need {needed:?} ({by})"
    );
}
