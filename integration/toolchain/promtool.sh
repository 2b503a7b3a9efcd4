#!/usr/bin/env bash
# Builds promtool from the Prometheus Go module the test bed already uses
# (integration/toolchain/prometheus.sh, same version) into
# $FLOTILLA_CACHE_DIR/bin/promtool-<version>/ and prints the binary's path.
# integration/tests/monitoring.rs checks and unit-tests deploy/monitoring's
# alerting rules with it.
set -euo pipefail

cache="${FLOTILLA_CACHE_DIR:-$HOME/.cache/flotilla}"
VERSION="$(sed -n 's/^VERSION="\(.*\)"$/\1/p' "$(dirname "${BASH_SOURCE[0]}")/prometheus.sh")"
bin="$cache/bin/promtool-$VERSION"
if [[ -x "$bin/promtool" ]]; then
  echo "$bin/promtool"
  exit 0
fi
mkdir -p "$cache/bin"
exec 9>"$cache/bin/promtool-$VERSION.lock"
flock 9
if [[ -x "$bin/promtool" ]]; then
  echo "$bin/promtool"
  exit 0
fi
mkdir -p "$bin.partial"
start=$(date +%s)
echo "building promtool $VERSION" >&2
CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$bin.partial" \
  go install -trimpath -ldflags "-s -w" -tags remove_all_sd \
  "github.com/prometheus/prometheus/cmd/promtool@$VERSION" >&2
rm -rf "$bin"
mv "$bin.partial" "$bin"
echo "promtool built in $(( $(date +%s) - start ))s" >&2
echo "$bin/promtool"
