#!/usr/bin/env bash
# The browser the dashboard's browser tests drive (tests/browser/): Debian's chromium and
# its version-matched chromedriver, from the distribution's own packages (nothing is
# downloaded from anywhere else). Idempotent: does nothing when both are there.
#
#   scripts/install-browser.sh      (as root, or with sudo available)
set -euo pipefail

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-browser: no apt-get here; install chromium and chromium-driver by hand" >&2
    echo "  (or set TRIOWORKER_SKIP_BROWSER=1 to skip the browser tests)" >&2
    exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi
echo "install-browser: installing chromium and chromium-driver with apt-get ..." >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
/usr/bin/chromium --version >&2
/usr/bin/chromedriver --version >&2
