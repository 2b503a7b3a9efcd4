#!/usr/bin/env bash
# Builds client-go's sample-controller (k8s.io/sample-controller, pinned in
# samplecontroller/go.mod) and copies its Foo CRD beside it, into
# $FLOTILLA_CACHE_DIR/bin/sample-controller-<pins>/. Prints that directory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/samplecontroller" && pwd)"
cache="${FLOTILLA_CACHE_DIR:-$HOME/.cache/flotilla}"
pin_hash="$(cat "$here/go.mod" "$here/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)"
out="$cache/bin/sample-controller-$pin_hash"
if [[ -x "$out/sample-controller" && -f "$out/crd.yaml" ]]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out.partial"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
cd "$here"
go build -trimpath -ldflags "-s -w" -o "$out.partial/sample-controller" k8s.io/sample-controller >&2
version="$(grep -m1 'k8s.io/sample-controller v' go.mod | awk '{print $2}')"
cp "$(go env GOMODCACHE)/k8s.io/sample-controller@$version/artifacts/examples/crd-status-subresource.yaml" \
  "$out.partial/crd.yaml"
chmod u+w "$out.partial/crd.yaml"
rm -rf "$out"
mv "$out.partial" "$out"
echo "$out"
