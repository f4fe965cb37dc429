#!/usr/bin/env bash
# Installs the Prometheus tools the deploy tests run (promtool, from Debian's `prometheus` package; Alertmanager for
# the monitoring-stack test). Idempotent: does nothing when both are already on PATH. Debian bookworm ships
# prometheus 2.42 and prometheus-alertmanager 0.25.
#
# The package's post-install script starts a Prometheus service where systemd runs; CI containers have no init, so
# policy-rc.d tells dpkg not to start anything (we run our own Prometheus, on our own ports, in the tests).
set -euo pipefail

need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 \
  || need+=(prometheus-alertmanager)
if [ "${#need[@]}" -eq 0 ]; then
  echo "observability tools present: $(promtool --version 2>&1 | head -n1)"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi

policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  created_policy=1
fi
cleanup() { if [ "$created_policy" = 1 ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT

install_packages() {
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}
known_to_apt() {
  local pkg
  for pkg in "${need[@]}"; do apt-cache show "$pkg" >/dev/null 2>&1 || return 1; done
}
# Refresh the package lists only when needed: apt cannot see a package (a fresh container has empty lists), or the
# install fails on stale lists (a mirror that no longer has the listed version).
if ! known_to_apt || ! install_packages; then
  $SUDO apt-get update -qq
  install_packages
fi
echo "installed ${need[*]}: $(promtool --version 2>&1 | head -n1)"
