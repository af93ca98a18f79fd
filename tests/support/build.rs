//! Building the workspace's programs from a test: the examples and the `redlock`
//! command, which `cargo test` does not always build for the test that runs them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `cargo build --quiet <args>` into the target directory of the running test
/// (a no-op when up to date), in the same profile, and returns that profile's
/// directory (`target/<profile>`). Panics if the build fails.
pub fn build_into_own_target(args: &[&str]) -> PathBuf {
    // A test runs as target/<profile>/deps/<name>-<hash>.
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf();
    let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    build
        .arg("build")
        .arg("--quiet")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env(
            "CARGO_TARGET_DIR",
            profile_dir.parent().expect("target dir"),
        );
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build");
    assert!(status.success(), "cargo build {args:?} failed");
    profile_dir
}
