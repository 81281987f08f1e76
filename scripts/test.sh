#!/usr/bin/env bash
# The test command of the README: installs what a fresh machine lacks, then runs every test.
# Tests that need Redis start their own redis-server processes on free loopback ports (and a
# 3-node Redis Cluster); a missing redis-server is a failure, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."

have() { command -v "$1" >/dev/null 2>&1; }

if ! have redis-server || ! have redis-cli; then
  echo "== installing redis-server and redis-cli (apt-get)"
  if have apt-get; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
  fi
fi
if ! have redis-server || ! have redis-cli; then
  echo "error: redis-server/redis-cli are required for the test suite and could not be installed" >&2
  exit 1
fi
echo "== $(redis-server --version)"

# Every test of the workspace, doctests included (the README's snippets among them), all of
# them even after a failure (a failing binary must not hide the next one's failures).
# `cargo test` builds the example programs too (workspace member `examples/`), which
# tests/examples/main.rs runs as processes; a separate `cargo build` of them would compile
# every dependency a second time, with other features. Two test threads: the machine this
# is tuned for has two cores.
cargo test --workspace --all-features --no-fail-fast -- --test-threads=2
