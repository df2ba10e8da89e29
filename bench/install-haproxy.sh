#!/usr/bin/env bash
# Installs HAProxy for the `peers` load benchmark
# (cargo run --release --example loadbench -- peers). Needs root (apt-get).
# The package's own service is not started: the benchmark runs haproxy
# itself, in the foreground (-db), with a config written to a temporary
# directory, and stops it at the end.
set -euo pipefail

if command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; then
    echo "haproxy already installed"
    exit 0
fi

# Keep apt from starting haproxy's service.
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
apt-get update && apt-get install -y --no-install-recommends haproxy
