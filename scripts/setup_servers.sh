#!/usr/bin/env bash
# Installs the third-party servers the `servers` test stage runs for real: Debian's
# prometheus package (the server and promtool). Nothing to do when they are present.
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
# The package's post-install would start a system service; this machine's policy-rc.d
# usually forbids it, and the tests start their own server on a free port anyway.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
  || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive \
       apt-get install -y --no-install-recommends prometheus; }
