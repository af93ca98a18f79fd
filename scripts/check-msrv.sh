# Sourced by scripts/test.sh: builds the library, every feature on, with the minimum
# Rust version that Cargo.toml declares (`rust-version`), so that the declaration is
# a fact. The toolchain comes from rustup; where rustup is missing or cannot download
# it, this says so in one line and the suite goes on (tests/msrv.rs still checks the
# declaration against every dependency's own `rust-version`).
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
if command -v rustup >/dev/null 2>&1 \
    && { rustup run "$msrv" rustc --version >/dev/null 2>&1 \
        || { echo "== [$(date +%H:%M:%S)] installing Rust $msrv with rustup for the MSRV check (once; about a minute)" >&2
             rustup toolchain install "$msrv" --profile minimal >&2; }; }; then
    echo "== [$(date +%H:%M:%S)] cargo +$msrv check -p redlock-runtime --all-features --lib --bins (the declared rust-version)" >&2
    # A target directory of its own: another compiler's artifacts would evict ours.
    CARGO_TARGET_DIR=target/msrv cargo "+$msrv" check --locked --quiet \
        -p redlock-runtime --all-features --lib --bins
else
    echo "== [$(date +%H:%M:%S)] rust-version $msrv not checked with its compiler: rustup could not install it" >&2
fi
