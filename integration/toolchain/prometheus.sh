#!/usr/bin/env bash
# Builds a command of the Prometheus Go module (prometheus, the default, or
# promtool) into $FLOTILLA_CACHE_DIR/bin/<command>-<version>/ (default
# ~/.cache/flotilla), shared by every checkout on the machine, and prints
# the binary's path. The rollout analysis tests query prometheus (#35);
# integration/tests/monitoring.rs checks deploy/monitoring's rules with
# promtool. Built without service discovery (`remove_all_sd`): the tests
# scrape static targets, and the cloud SDKs would double the build.
#   integration/toolchain/prometheus.sh [prometheus|promtool]
set -euo pipefail

cmd="${1:-prometheus}"
[[ $cmd == prometheus || $cmd == promtool ]] || { echo "usage: $0 [prometheus|promtool]" >&2; exit 64; }
cache="${FLOTILLA_CACHE_DIR:-$HOME/.cache/flotilla}"
VERSION="v0.316.0"
bin="$cache/bin/$cmd-$VERSION"
if [[ -x "$bin/$cmd" ]]; then
  echo "$bin/$cmd"
  exit 0
fi
# One build at a time: a test run on its own builds it too, and a second
# caller waits here for the first one's build.
mkdir -p "$cache/bin"
exec 9>"$cache/bin/$cmd-$VERSION.lock"
flock 9
if [[ -x "$bin/$cmd" ]]; then
  echo "$bin/$cmd"
  exit 0
fi
mkdir -p "$bin.partial"
start=$(date +%s)
echo "building $cmd $VERSION" >&2
CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$bin.partial" \
  go install -trimpath -ldflags "-s -w" -tags remove_all_sd \
  "github.com/prometheus/prometheus/cmd/$cmd@$VERSION" >&2
rm -rf "$bin"
mv "$bin.partial" "$bin"
echo "$cmd built in $(( $(date +%s) - start ))s" >&2
echo "$bin/$cmd"
