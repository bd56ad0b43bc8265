#!/usr/bin/env bash
# Make sure `promtool` is there, so tests/unit/test_metrics_catalog.py also checks the
# alert rules and their unit tests (deploy/prometheus/) with Prometheus's own tool.
# Does nothing when it is on PATH; otherwise installs Debian's `prometheus` package
# (which ships promtool) with apt-get; that needs root. Exit status 0 = promtool runs.
set -euo pipefail

say() { echo "ensure-promtool: $*"; }

if command -v promtool >/dev/null 2>&1; then
    say "$(promtool --version 2>&1 | head -n1)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    say "promtool is missing; installing Debian's prometheus needs root" >&2
    exit 1
fi
say "installing prometheus (for promtool) with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# policy-rc.d 101: the package must not start a Prometheus server here.
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get install -y -q --no-install-recommends prometheus
say "$(promtool --version 2>&1 | head -n1)"
