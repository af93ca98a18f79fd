//! Compile-time behaviour of `#[distributed_lock]`: errors in `tests/ui/*.rs` (each with
//! its expected `.stderr`), supported shapes in `tests/ui/pass/*.rs`.
//!
//! Regenerate the `.stderr` files with `TRYBUILD=overwrite` and read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui/pass/*.rs");
}

/// No error the attribute gives names the runtime's internals: the `__private` door of
/// the expansion, or a path inside the runtime's sources.
#[test]
fn no_error_names_the_expansions_internals() {
    let mut checked = 0;
    for entry in std::fs::read_dir("tests/ui").expect("tests/ui") {
        let path = entry.expect("an entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("stderr") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read a .stderr");
        for internal in ["__private", "redlock-runtime/src", "redlock_runtime::__"] {
            assert!(
                !text.contains(internal),
                "{} names `{internal}`:\n{text}",
                path.display()
            );
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} .stderr files found");
}
