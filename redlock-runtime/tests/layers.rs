//! The runtime's modules form layers: each uses only modules below it. This test
//! reads every path to a module of the crate in each source file, code and doc links
//! alike — `crate::m`, `crate::{m, n}`, `super::m`, and items re-exported by lib.rs
//! (`crate::LockClient` is the `client` module) — in every file below src/, and fails
//! on one that points up or sideways-up, so that the import circle the
//! engine was rebuilt to remove cannot come back unnoticed.

use std::path::Path;

/// Bottom to top. A module may name only modules earlier in this list.
const LAYERS: &[&str] = &[
    "error",         // LockError
    "config",        // client settings, limits, URL redaction
    "metrics",       // the `metrics` feature's instruments (empty functions without it)
    "cleanup",       // spawn-on-drop; counting background tasks
    "grant",         // a grant's steps on the client it was made to: one type per step
    "grant_watch",   // when the releasing client checks its grants (one check a key)
    "scripts",       // the Lua scripts, key and channel names
    "sentinel",      // following the primary Sentinel names
    "connection",    // one server / cluster / sentinel connection; slots; slot-moving retries
    "confirm",       // connections of their own for WAIT-confirmed acquisitions
    "notify",        // release messages, demultiplexed to waiters
    "node",          // one server's operations
    "connect",       // connecting in each mode, giving a node
    "masters",       // the majority over servers (pure tallies + I/O)
    "limits",        // what a request may ask for
    "fenced",        // fenced writes to a user's resource (FencedKey)
    "hand_off",      // passing a lock to the next task of the client (the baton)
    "turn",          // the in-process turn of a client's tasks
    "state",         // a held lock's shared state (lost? lease until?)
    "watchdog",      // batched renewal
    "core",          // a client's shared core
    "guard",         // LockGuard
    "acquire",       // LockRequest: validate → take turn → attempt / wait
    "operate",       // who holds a lock, every lock, force-unlock
    "election",      // leader election: a lock held with the watchdog, its holder the leader
    "multi",         // several keys locked as one (lock_all): canonical order over LockRequest
    "client",        // LockClient and its builder
    "macro_support", // what the attribute calls
    "test_util",     // a throwaway redis-server for users' tests (feature `test-util`)
    "lib",           // re-exports only
    "bin",           // the `redlock` command (feature `cli`): the public API only
];

/// The modules a source text names: `crate::m`, each `m` of a `crate::{m, n::…}`
/// group, and — in a module at the crate's top level — `super::m`, which is the same
/// path. A name starting with a capital letter is an item `lib.rs` re-exports
/// (`crate::LockClient`): it is mapped to the module it comes from.
fn modules_named_in(text: &str, reexports: &[(String, String)]) -> Vec<String> {
    let ident = |rest: &str| -> String {
        rest.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut named = Vec::new();
    let mut name = |first: String| {
        if first.is_empty() {
            return;
        }
        match reexports.iter().find(|(item, _)| *item == first) {
            Some((_, module)) => named.push(module.clone()),
            None => named.push(first),
        }
    };
    for prefix in ["crate::", "super::"] {
        let mut rest = text;
        while let Some(at) = rest.find(prefix) {
            rest = &rest[at + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for part in group[..end].split(',') {
                    name(ident(part.trim()));
                }
            } else {
                name(ident(rest));
            }
        }
    }
    named
}

/// `pub use module::{Item, …}` and `pub use module::Item` lines of lib.rs.
fn reexports(lib: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for line in lib.lines() {
        let Some(path) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let path = path.trim_end_matches(';');
        let Some((module, items)) = path.split_once("::") else {
            continue;
        };
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let item = item.trim().rsplit("::").next().unwrap_or("").to_owned();
            if item.starts_with(|c: char| c.is_ascii_uppercase()) {
                found.push((item, module.to_owned()));
            }
        }
    }
    found
}

/// Every `.rs` file below `dir`, with the top-level module it belongs to.
fn sources(dir: &Path, top: Option<&str>, into: &mut Vec<(String, std::path::PathBuf)>) {
    for entry in std::fs::read_dir(dir).expect("read a source folder") {
        let path = entry.expect("a source entry").path();
        let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if path.is_dir() {
            sources(&path, Some(top.unwrap_or(&stem)), into);
        } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
            into.push((top.map_or(stem, str::to_owned), path));
        }
    }
}

#[test]
fn every_module_uses_only_modules_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    let reexports = reexports(&lib);
    let mut files = Vec::new();
    sources(&src, None, &mut files);
    let mut seen = Vec::new();
    let mut upward = Vec::new();
    for (module, path) in files {
        let Some(level) = LAYERS.iter().position(|m| *m == module) else {
            panic!("src/{module} is in no layer: add it to LAYERS in tests/layers.rs");
        };
        seen.push(module.clone());
        let text = std::fs::read_to_string(&path).expect("read a source file");
        for named in modules_named_in(&text, &reexports) {
            if named == module {
                continue;
            }
            match LAYERS.iter().position(|m| *m == named) {
                Some(other) if other < level => {}
                Some(_) => upward.push(format!("{} → {named}", path.display())),
                // Not a module of ours (`super::*` in a test module, a std path).
                None => {}
            }
        }
    }
    assert!(
        upward.is_empty(),
        "modules naming modules above them: {upward:?}"
    );
    for module in LAYERS {
        assert!(
            seen.iter().any(|m| m == module),
            "LAYERS lists `{module}`, which is not in src/"
        );
    }
}

#[test]
fn the_checker_sees_every_way_of_naming_a_module() {
    let reexports =
        reexports("pub use client::{LockClient, LockClientBuilder};\npub use guard::LockGuard;");
    assert_eq!(
        reexports,
        [
            ("LockClient".to_owned(), "client".to_owned()),
            ("LockClientBuilder".to_owned(), "client".to_owned()),
            ("LockGuard".to_owned(), "guard".to_owned()),
        ]
    );
    let text = "use crate::guard::X; use crate::{masters, node::Y}; use super::state::Z; \
                /// [`c`](crate::LockClient)";
    assert_eq!(
        modules_named_in(text, &reexports),
        ["guard", "masters", "node", "client", "state"]
    );
}
