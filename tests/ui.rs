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
