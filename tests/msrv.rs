//! The minimum Rust version the workspace declares (`rust-version` in Cargo.toml) holds
//! for what a user builds: no crate in `redlock-runtime`'s dependency graph, with every
//! feature on, declares a newer one. (`scripts/check-msrv.sh` also builds the library
//! with that very compiler when rustup can install it, and clippy's `incompatible_msrv`
//! lint, which reads the same field, flags a newer standard library API in our code.)

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

/// `"1.89"` or `"1.89.0"` as a comparable triple.
fn version(text: &str) -> (u64, u64, u64) {
    let mut parts = text.split('.').map(|part| {
        part.parse::<u64>()
            .unwrap_or_else(|_| panic!("not a Rust version: {text:?}"))
    });
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    let patch = parts.next().unwrap_or(0);
    (major, minor, patch)
}

fn declared() -> String {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("the workspace's Cargo.toml");
    manifest
        .lines()
        .find_map(|line| {
            line.strip_prefix("rust-version = \"")
                .and_then(|rest| rest.strip_suffix('"'))
        })
        .expect("rust-version in [workspace.package]")
        .to_owned()
}

#[test]
fn no_dependency_of_the_library_needs_a_newer_rust_than_declared() {
    let declared = declared();
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--offline",
            "--all-features",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata's JSON");
    let packages: HashMap<&str, &serde_json::Value> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|package| (package["id"].as_str().expect("id"), package))
        .collect();
    let nodes: HashMap<&str, &serde_json::Value> = metadata["resolve"]["nodes"]
        .as_array()
        .expect("resolve nodes")
        .iter()
        .map(|node| (node["id"].as_str().expect("id"), node))
        .collect();
    let runtime = packages
        .values()
        .find(|package| package["name"] == "redlock-runtime")
        .expect("redlock-runtime in the workspace")["id"]
        .as_str()
        .expect("id");

    // Every crate a user's build of the library compiles: normal and build
    // dependencies, transitively (not the dev-dependencies of our tests).
    let mut seen = BTreeSet::new();
    let mut stack = vec![runtime];
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dependency in nodes[id]["deps"].as_array().expect("deps") {
            let used_by_users = dependency["dep_kinds"]
                .as_array()
                .expect("dep_kinds")
                .iter()
                .any(|kind| kind["kind"].is_null() || kind["kind"] == "build");
            if used_by_users {
                stack.push(dependency["pkg"].as_str().expect("pkg"));
            }
        }
    }
    assert!(seen.len() > 20, "too few crates walked: {}", seen.len());

    let newer: Vec<String> = seen
        .iter()
        .filter_map(|id| {
            let package = packages[id];
            let needs = package["rust_version"].as_str()?;
            (version(needs) > version(&declared)).then(|| {
                format!(
                    "{} {} needs Rust {needs}",
                    package["name"].as_str().unwrap_or("?"),
                    package["version"].as_str().unwrap_or("?")
                )
            })
        })
        .collect();
    assert!(
        newer.is_empty(),
        "Cargo.toml declares rust-version {declared}, but {}: raise it (and check it with \
         scripts/check-msrv.sh)",
        newer.join(", ")
    );
}
