#!/usr/bin/env bash
# Builds CoreDNS from its Go module into $FLOTILLA_CACHE_DIR/bin/coredns-<version>/
# (default ~/.cache/flotilla), shared by every checkout on the machine, and
# prints the binary's path. Its etcd plugin serves the fleet registry's zone.
set -euo pipefail

cache="${FLOTILLA_CACHE_DIR:-$HOME/.cache/flotilla}"
VERSION="v1.15.0"
bin="$cache/bin/coredns-$VERSION"
if [[ -x "$bin/coredns" ]]; then
  echo "$bin/coredns"
  exit 0
fi
mkdir -p "$bin.partial"
start=$(date +%s)
echo "building coredns $VERSION" >&2
CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$bin.partial" \
  go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$VERSION" >&2
rm -rf "$bin"
mv "$bin.partial" "$bin"
echo "coredns built in $(( $(date +%s) - start ))s" >&2
echo "$bin/coredns"
