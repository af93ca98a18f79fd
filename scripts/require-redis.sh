# Sourced by the scripts beside it: makes sure redis-server, redis-cli and
# redis-benchmark (package redis-tools, which redis-server depends on) are installed.
# As root it installs them with apt-get; otherwise it prints the exact command to run
# and stops.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1 \
    || ! command -v redis-benchmark >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "redis-server is missing: installing it with apt-get" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null || {
            echo "apt-get could not install redis-server" >&2
            exit 1
        }
    else
        echo "redis-server is missing. Install it with:" >&2
        echo "    sudo apt-get install -y redis-server redis-tools" >&2
        exit 1
    fi
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is missing. Install Rust with:" >&2
    echo "    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh" >&2
    exit 1
fi
