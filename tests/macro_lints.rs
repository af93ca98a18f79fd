//! `#[distributed_lock]` puts no lint on the user's code: `cargo clippy -- -D warnings`
//! over a crate of annotated functions in every shape (tests/ui/pass/no_warnings.rs, which
//! the trybuild pass cases also build, with rustc's lint groups denied in the file).
//!
//! Clippy runs on a small crate made here, outside the workspace, that depends on the
//! local `redlock-runtime` by path: clippy lints only the crates of the workspace it is run
//! in, and this one holds only the user's code. It has a target directory of its own under
//! `target/tmp` (the outer `cargo test` may hold the workspace's), kept between runs, so
//! only the first run checks the dependencies; it runs offline with the workspace's
//! `Cargo.lock`, so it resolves to the versions already downloaded.

use std::path::Path;
use std::process::Command;

#[test]
fn clippy_denying_warnings_passes_on_annotated_functions() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("macro_lints");
    std::fs::create_dir_all(dir.join("src")).expect("create the crate's directory");
    let runtime = workspace.join("redlock-runtime");
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\n\
             name = \"macro-lints\"\n\
             version = \"0.0.0\"\n\
             edition = \"2024\"\n\
             publish = false\n\
             \n\
             # Its own workspace: it lives under the redlock workspace's target directory.\n\
             [workspace]\n\
             \n\
             [dependencies]\n\
             redlock-runtime = {{ path = {runtime:?} }}\n",
        ),
    )
    .expect("write Cargo.toml");
    std::fs::copy(workspace.join("Cargo.lock"), dir.join("Cargo.lock")).expect("copy Cargo.lock");
    let annotated = std::fs::read_to_string(workspace.join("tests/ui/pass/no_warnings.rs"))
        .expect("read the annotated functions");
    // The shapes that must stay lint-free, each generated differently: one key, several
    // keys locked as one (`run_locked_all`), `on_busy = "skip"`, a read lock, a semaphore.
    for shape in [
        "key = \"",
        "keys = [",
        "on_busy = \"skip\"",
        "mode = \"read\"",
        "permits = ",
    ] {
        assert!(
            annotated.contains(shape),
            "tests/ui/pass/no_warnings.rs has no `{shape}` case"
        );
    }
    std::fs::write(dir.join("src/main.rs"), annotated).expect("write the annotated functions");

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["clippy", "--offline", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .args(["--", "-D", "warnings"])
        .env("CARGO_TARGET_DIR", dir.join("target"))
        // The outer build's flags are for the workspace; the lints are the crate's own.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("run cargo clippy (`rustup component add clippy` if it is missing)");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("no such command"),
        "cargo clippy is not installed: `rustup component add clippy`\n{stderr}"
    );
    assert!(
        output.status.success(),
        "cargo clippy -- -D warnings failed on tests/ui/pass/no_warnings.rs:\n{stderr}"
    );
}
