//! The runtime's modules form layers: each uses only modules below it. This test
//! reads every `crate::<module>` path in each source file (code and doc links alike)
//! and fails on one that points up or sideways-up, so that the import circle the
//! engine was rebuilt to remove cannot come back unnoticed.

use std::path::Path;

/// Bottom to top. A module may name only modules earlier in this list.
const LAYERS: &[&str] = &[
    "error",         // LockError
    "config",        // client settings, limits, URL redaction
    "scripts",       // the Lua scripts, key and channel names
    "sentinel",      // following the primary Sentinel names
    "connection",    // one server / cluster / sentinel connection; slots
    "notify",        // release messages, demultiplexed to waiters
    "node",          // one server's operations
    "masters",       // the majority over servers (pure tallies + I/O)
    "limits",        // what a request may ask for
    "turn",          // the in-process turn of a client's tasks, and the hand-off
    "state",         // a held lock's shared state (lost? lease until?)
    "watchdog",      // batched renewal
    "cleanup",       // spawn-on-drop
    "core",          // a client's shared core
    "guard",         // LockGuard
    "acquire",       // LockRequest: validate → take turn → attempt / wait
    "client",        // LockClient and its builder
    "macro_support", // what the attribute calls
    "lib",           // re-exports only
];

fn modules_named_in(text: &str) -> Vec<String> {
    let mut named = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if !name.is_empty() {
            named.push(name);
        }
    }
    named
}

#[test]
fn every_module_uses_only_modules_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut seen = Vec::new();
    let mut upward = Vec::new();
    for entry in std::fs::read_dir(&src).expect("read src/") {
        let path = entry.expect("a src entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let module = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let Some(level) = LAYERS.iter().position(|m| *m == module) else {
            panic!("src/{module}.rs is in no layer: add it to LAYERS in tests/layers.rs");
        };
        seen.push(module.clone());
        let text = std::fs::read_to_string(&path).expect("read a source file");
        for named in modules_named_in(&text) {
            if named == module {
                continue;
            }
            match LAYERS.iter().position(|m| *m == named) {
                Some(other) if other < level => {}
                Some(_) => upward.push(format!("{module} → {named}")),
                // `crate::Foo` re-exports and the like are not modules.
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
fn the_checker_sees_an_upward_path() {
    assert_eq!(
        modules_named_in("use crate::guard::LockGuard; /// see [`x`](crate::masters::Masters)"),
        ["guard", "masters"]
    );
}
