#!/usr/bin/env bash
# The API's toolchain (#61), built or installed once into
# $FLOTILLA_CACHE_DIR/bin/<tool>-<version>/ (default ~/.cache/flotilla) and
# shared by every checkout on the machine; prints the tool's path.
#   buf                 the buf Go module: lint, breaking and generate
#   protoc-gen-go       Go message stubs (google.golang.org/protobuf)
#   protoc-gen-go-grpc  Go service stubs (google.golang.org/grpc)
#   python              a virtualenv with grpcio, grpcio-tools and
#                       grpcio-status from PyPI; prints its python
#   integration/toolchain/api-tools.sh TOOL
set -euo pipefail

tool="${1:-}"
case "$tool" in
  buf) version=v1.75.0 module=github.com/bufbuild/buf/cmd/buf ;;
  protoc-gen-go) version=v1.36.12 module=google.golang.org/protobuf/cmd/protoc-gen-go ;;
  protoc-gen-go-grpc) version=v1.6.2 module=google.golang.org/grpc/cmd/protoc-gen-go-grpc ;;
  python) version=1.85.1 ;;
  *) echo "usage: $0 buf|protoc-gen-go|protoc-gen-go-grpc|python" >&2; exit 64 ;;
esac
cache="${FLOTILLA_CACHE_DIR:-$HOME/.cache/flotilla}"
dir="$cache/bin/$tool-$version"
out="$dir/$tool" done="$dir/$tool"
# A venv's paths are absolute, so it is made where it stays, and a marker
# says it is whole.
[[ $tool == python ]] && out="$dir/bin/python" done="$dir/.installed"
if [[ -e "$done" ]]; then
  echo "$out"
  exit 0
fi
# One install at a time: a second caller waits here for the first.
mkdir -p "$cache/bin"
exec 9>"$dir.lock"
flock 9
if [[ -e "$done" ]]; then
  echo "$out"
  exit 0
fi
rm -rf "$dir.partial"
start=$(date +%s)
echo "installing $tool $version" >&2
if [[ $tool == python ]]; then
  rm -rf "$dir"
  python3 -m venv "$dir" >&2
  # One version for the three: grpcio-tools' protoc writes code for the
  # protobuf runtime it brings.
  timeout 600 "$dir/bin/pip" install --quiet --disable-pip-version-check \
    "grpcio==$version" "grpcio-tools==$version" "grpcio-status==$version" >&2 || { rm -rf "$dir"; exit 1; }
  touch "$done"
else
  CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$dir.partial" \
    timeout 1200 go install -trimpath -ldflags "-s -w" "$module@$version" >&2
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
fi
echo "$tool installed in $(( $(date +%s) - start ))s" >&2
echo "$out"
