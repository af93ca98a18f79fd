//! The README's "Getting started", followed as a newcomer would: a new crate made of the
//! README's `Cargo.toml` and `src/main.rs` blocks, exactly as written, next to a checkout
//! of this repository at `../redlock` (the path the README's dependency line names),
//! built, and run against a throwaway redis-server — then against a port where nothing
//! listens, where it must print one line that says why.
//!
//! The crate's lock file is this repository's (the versions the suite tested; cargo
//! drops what the new crate does not use), and it is built offline: the suite has
//! fetched every crate it needs. It is built with its own target directory (`target/getting-started`): the
//! suite's `cargo test` holds the workspace's. The first build in a clean checkout
//! compiles the library's dependencies once more (about a minute on two cores).

use std::path::Path;
use std::process::Command;

use redlock_testkit::RedisServer;

/// The fenced block that follows `<!-- getting-started: NAME -->` in the README.
fn block(readme: &str, name: &str) -> String {
    let marker = format!("<!-- getting-started: {name} -->");
    let after = readme
        .split_once(&marker)
        .unwrap_or_else(|| panic!("the README has no {marker}"))
        .1;
    let fence_start = after.find("```").expect("a fenced block after the marker");
    let body_start = fence_start
        + after[fence_start..]
            .find('\n')
            .expect("a newline after the fence")
        + 1;
    let body_len = after[body_start..]
        .find("\n```")
        .expect("the block's closing fence");
    format!("{}\n", &after[body_start..body_start + body_len])
}

#[test]
fn the_readme_getting_started_builds_and_runs_as_written() {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(repository.join("README.md")).expect("README.md");
    let manifest = block(&readme, "Cargo.toml");
    let main = block(&readme, "src/main.rs");

    let place = tempfile::Builder::new()
        .prefix("redlock-getting-started-")
        .tempdir()
        .expect("a temporary directory");
    std::os::unix::fs::symlink(repository, place.path().join("redlock"))
        .expect("link the checkout as ../redlock");
    let shop = place.path().join("shop");
    std::fs::create_dir_all(shop.join("src")).expect("the crate's directories");
    std::fs::write(shop.join("Cargo.toml"), &manifest).expect("Cargo.toml");
    std::fs::write(shop.join("src/main.rs"), &main).expect("src/main.rs");
    // The versions this suite tested, rather than whatever the registry cache holds
    // newest; cargo drops the entries the new crate does not use.
    std::fs::copy(repository.join("Cargo.lock"), shop.join("Cargo.lock")).expect("Cargo.lock");

    let target = repository.join("target/getting-started");
    let build = Command::new(env!("CARGO"))
        .args(["build", "--offline", "--quiet"])
        .current_dir(&shop)
        .env("CARGO_TARGET_DIR", &target)
        // A newcomer's first build prints no warning either.
        .env("RUSTFLAGS", "-D warnings")
        .output()
        .expect("run cargo build");
    assert!(
        build.status.success(),
        "the README's crate does not build:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let binary = target.join("debug/shop");

    // Against a Redis that is there.
    let redis = RedisServer::start();
    let run = Command::new(&binary)
        .env("REDLOCK_URL", redis.url())
        .output()
        .expect("run the README's program");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "exit {:?}: {stderr}", run.status);
    assert!(
        stdout.starts_with("paid order 42 (2500 cents) under fencing token "),
        "{stdout}"
    );
    let token: u64 = stdout
        .trim_end()
        .rsplit(' ')
        .next()
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("no fencing token in {stdout:?}"));
    assert!(token > 0);
    // It released its lock and left nothing but the fencing counter.
    let keys = redis.cli(&["--scan"]);
    assert_eq!(keys.trim(), "redlock:fence", "keys left: {keys}");

    // Against a port where nothing listens (free a moment ago; never 6379): one line
    // that names the key, the server and the cause.
    let nowhere = format!("redis://127.0.0.1:{}/", redlock_testkit::free_port());
    let run = Command::new(&binary)
        .env("REDLOCK_URL", &nowhere)
        .output()
        .expect("run the README's program");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(
        stderr.contains(&nowhere) && stderr.to_lowercase().contains("refused"),
        "the server or the cause is missing: {stderr}"
    );
}
