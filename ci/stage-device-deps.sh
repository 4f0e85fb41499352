#!/usr/bin/env bash
# Stages the Debian packages memgate builds against (GoogleTest, Google Benchmark, yaml-cpp, nlohmann/json, fmt,
# CLI11, gloo's headers) into <checkout>/.device-deps, unpacked, for a GPU machine that lacks them and has no network:
# copy .device-deps along; the gpu configure preset looks there first (CMAKE_PREFIX_PATH) and the build's RPATH
# finds the two shared libraries (yaml-cpp, fmt) there. Run it here, on a machine that reaches Debian's archive.
set -euo pipefail
top=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dest="$top/.device-deps"
pkgs=(libgtest-dev libgmock-dev googletest libbenchmark-dev libbenchmark1debian libyaml-cpp-dev libyaml-cpp0.7
      nlohmann-json3-dev libfmt-dev libfmt9 libcli11-dev libgloo-dev "$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ] || apt-get update -qq
(cd "$tmp" && apt-get download -qq "${pkgs[@]}" 2>&1 | grep -v "unsandboxed" >&2 || true)
[ "$(ls "$tmp"/*.deb | wc -l)" -eq "${#pkgs[@]}" ] || { echo "stage-device-deps: some packages did not download" >&2; exit 1; }
rm -rf "$dest" && mkdir -p "$dest"
for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$dest"; done
du -sh "$dest" | sed 's/^/staged: /'
