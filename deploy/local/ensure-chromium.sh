#!/usr/bin/env bash
# Make sure a headless Chromium is there for the console's browser test
# (tests/e2e/test_console.py, driven by Playwright with executable_path set; we never
# run `playwright install`). Does nothing when $CHROMIUM (default /usr/bin/chromium)
# already runs. Otherwise, on this (Debian) machine, installs Debian's `chromium`
# package with apt-get; that needs root. Exit status 0 = a browser is there.
set -euo pipefail

chromium="${CHROMIUM:-/usr/bin/chromium}"
say() { echo "ensure-chromium: $*"; }

works() { [ -x "$chromium" ] && "$chromium" --headless --version >/dev/null 2>&1; }

if works; then
    say "$("$chromium" --version 2>/dev/null | head -n1)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    say "$chromium is missing; installing Debian's chromium needs root" >&2
    exit 1
fi
say "installing chromium with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
if ! works; then
    say "chromium was installed but $chromium does not run" >&2
    exit 1
fi
say "$("$chromium" --version 2>/dev/null | head -n1)"
