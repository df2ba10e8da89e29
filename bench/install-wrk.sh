#!/usr/bin/env bash
# Installs wrk, the HTTP load generator of the `gateway` load benchmark
# (cargo run --release --features web --example loadbench -- gateway).
# Needs root (apt-get).
set -euo pipefail

if command -v wrk >/dev/null 2>&1; then
    echo "wrk already installed"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update && apt-get install -y wrk
