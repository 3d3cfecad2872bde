#!/usr/bin/env bash
# Installs the browser the admin console's tests drive (tests/browser, `servers` stage):
# Debian's chromium package, used by Playwright as its executable (`playwright install`,
# which downloads a browser build of its own, is never needed). Nothing to do when present.
set -euo pipefail
if command -v chromium >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium \
  || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive \
       apt-get install -y --no-install-recommends chromium; }
