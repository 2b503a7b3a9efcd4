#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd
# and kwok from their Go modules into $FLOTILLA_CACHE_DIR/bin/<version>-<pins>/
# (default ~/.cache/flotilla), shared by every checkout on the machine. A build
# is reused until the pins (go.mod, go.sum, this script) change. Prints the
# bin directory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${FLOTILLA_CACHE_DIR:-$HOME/.cache/flotilla}"
K8S_VERSION="v1.36.3"
KWOK_VERSION="v0.8.0"

pin_hash="$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)"
bin="$cache/bin/$K8S_VERSION-$pin_hash"
tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok)

complete=1
for t in "${tools[@]}"; do [[ -x "$bin/$t" ]] || complete=0; done
if [[ $complete == 1 ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$bin.partial"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
# Parallelism: two cores; let go decide, but keep the linker from starving tests.
commit="$(grep -m1 'k8s.io/kubernetes v' "$here/go.mod" | awk '{print $2}')"
minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
pkgs=(k8s.io/component-base/version k8s.io/client-go/pkg/version)
ldflags="-s -w"
for p in "${pkgs[@]}"; do
  ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z -X $p.gitCommit=$commit"
done

cd "$here"
start=$(date +%s)
for t in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  echo "building $t $K8S_VERSION" >&2
  go build -trimpath -ldflags "$ldflags" -o "$bin.partial/$t" "k8s.io/kubernetes/cmd/$t" >&2
done
echo "building etcd (go.etcd.io/etcd/server/v3, as required by k8s.io/kubernetes)" >&2
go build -trimpath -ldflags "-s -w" -o "$bin.partial/etcd" go.etcd.io/etcd/server/v3 >&2
echo "building kwok $KWOK_VERSION" >&2
GOBIN="$bin.partial" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
rm -rf "$bin"
mv "$bin.partial" "$bin"
echo "toolchain built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
