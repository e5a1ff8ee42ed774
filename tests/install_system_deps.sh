#!/usr/bin/env bash
# Installs the system packages the integration tests need, when they are missing:
#   - prometheus (Debian package): the real Prometheus server and promtool.
# Runs apt-get only as root on a Debian-like system; otherwise prints what to install and
# exits 0, and the tests that need the package skip with that reason.
set -euo pipefail

missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install_system_deps: installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # The package's post-install never starts a daemon here (no init system); the tests start
    # their own Prometheus on a free loopback port.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    echo "install_system_deps: missing ${missing[*]}; install them (Debian: apt-get install ${missing[*]})" \
         "to run the Prometheus integration tests" >&2
fi
