#!/usr/bin/env bash
# Installs nginx for the `nginx` and `slow-node` load benchmarks
# (cargo run --release --example loadbench -- nginx) and for the test
# tests/keepalive.rs, which `.ci/run` makes require it. Needs root (apt-get).
# The package's own service is not started: the benchmark runs nginx itself,
# in the foreground, with a config in a temporary directory.
set -euo pipefail

if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
    echo "nginx already installed"
    exit 0
fi

# Keep apt from starting nginx's service (which would listen on port 80).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    made_policy=1
fi
cleanup() { if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
apt-get update && apt-get install -y nginx-light || apt-get install -y nginx
