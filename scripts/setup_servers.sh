#!/usr/bin/env bash
# Installs the third-party tools the `servers` test stage runs for real: Debian's prometheus
# package (the server and promtool) and Debian's kubernetes-client (kubectl, whose built-in
# kustomize renders deploy/k8s). Nothing to do when they are present.
set -euo pipefail
PACKAGES=()
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  PACKAGES+=(prometheus)
fi
if ! command -v kubectl >/dev/null; then
  PACKAGES+=(kubernetes-client)
fi
if [ "${#PACKAGES[@]}" = 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
# The prometheus package's post-install would start a system service; this machine's
# policy-rc.d usually forbids it, and the tests start their own server on a free port anyway.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}" \
  || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive \
       apt-get install -y --no-install-recommends "${PACKAGES[@]}"; }
