#!/bin/sh
# The web console's browser tests drive headless Chromium with Playwright for Python,
# pointed at Debian's `chromium` (Playwright's own browser download is never used: it
# would need the internet at test time and a browser the project does not pin).
# Installs Debian's chromium when /usr/bin/chromium is missing. Needs root (or sudo).
set -eu

if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-chromium: no /usr/bin/chromium and no apt-get: install Chromium, then retry" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
/usr/bin/chromium --version
