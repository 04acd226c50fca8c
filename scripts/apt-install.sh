#!/usr/bin/env bash
# Installs Debian packages for a test: `apt-install.sh WHO PKG... -- CMD...`
# does nothing when every CMD is on PATH, else installs every PKG (as root,
# or through `sudo -n`), refreshing a stale package index once, and fails
# unless every CMD is then on PATH.
set -euo pipefail
who=$1
shift
pkgs=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  pkgs+=("$1")
  shift
done
shift
have() {
  for c in "$@"; do
    command -v "$c" > /dev/null || return 1
  done
}
if have "$@"; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo > /dev/null; then
  sudo=(sudo -n)
else
  echo "$who: not root and no sudo; install ${pkgs[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# An install from a stale or empty package index fails; refresh it then retry once.
if ! "${sudo[@]}" apt-get install -y -qq "${pkgs[@]}" > /dev/null; then
  "${sudo[@]}" apt-get update -qq > /dev/null
  "${sudo[@]}" apt-get install -y -qq "${pkgs[@]}" > /dev/null
fi
have "$@"
