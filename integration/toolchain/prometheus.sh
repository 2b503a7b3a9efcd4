#!/usr/bin/env bash
# Builds Prometheus from its Go module into $FLOTILLA_CACHE_DIR/bin/prometheus-<version>/
# (default ~/.cache/flotilla), shared by every checkout on the machine, and
# prints the binary's path. The rollout analysis tests query it (#35).
# Built without service discovery (`remove_all_sd`): the tests scrape static
# targets, and the cloud SDKs would double the build.
set -euo pipefail

cache="${FLOTILLA_CACHE_DIR:-$HOME/.cache/flotilla}"
VERSION="v0.316.0"
bin="$cache/bin/prometheus-$VERSION"
if [[ -x "$bin/prometheus" ]]; then
  echo "$bin/prometheus"
  exit 0
fi
# One build at a time: a test run on its own builds it too, and a second
# caller waits here for the first one's build.
mkdir -p "$cache/bin"
exec 9>"$cache/bin/prometheus-$VERSION.lock"
flock 9
if [[ -x "$bin/prometheus" ]]; then
  echo "$bin/prometheus"
  exit 0
fi
mkdir -p "$bin.partial"
start=$(date +%s)
echo "building prometheus $VERSION" >&2
CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$bin.partial" \
  go install -trimpath -ldflags "-s -w" -tags remove_all_sd \
  "github.com/prometheus/prometheus/cmd/prometheus@$VERSION" >&2
rm -rf "$bin"
mv "$bin.partial" "$bin"
echo "prometheus built in $(( $(date +%s) - start ))s" >&2
echo "$bin/prometheus"
