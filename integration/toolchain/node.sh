#!/usr/bin/env bash
# Builds what a real node of the home cluster runs, from Go modules (and the
# pause container from the C source inside the Kubernetes module), into
# $FLOTILLA_CACHE_DIR/bin/node-<pins>/ (default ~/.cache/flotilla), and prints
# that directory: containerd with its runc shim and ctr, runc, crictl, the CNI
# bridge, host-local, loopback and portmap plugins, kubelet, kube-proxy, pause,
# and flotilla-image (our image writer, ./image). Reused until the pins change.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${FLOTILLA_CACHE_DIR:-$HOME/.cache/flotilla}"
K8S_VERSION="v1.36.3"
CONTAINERD_VERSION="v2.4.2"
RUNC_VERSION="v1.5.3"
CNI_PLUGINS_VERSION="v1.10.0"
CRICTL_VERSION="v1.37.0"
PAUSE_VERSION="3.10.2" # what containerd $CONTAINERD_VERSION names its sandbox image

pin_hash="$(cat "$here/node.sh" "$here/kubelet/go.mod" "$here/kubelet/go.sum" "$here/image/go.mod" \
  "$here/image/go.sum" "$here/image/main.go" | sha256sum | cut -c1-12)"
bin="$cache/bin/node-$pin_hash"
if [[ -x "$bin/kubelet" && -x "$bin/flotilla-image" ]]; then
  echo "$bin"
  exit 0
fi

missing=()
command -v gcc >/dev/null || missing+=(gcc)
# runc filters system calls with libseccomp (the operator's Pods ask for
# the RuntimeDefault profile); the static pause binary needs libc.a.
[[ -e /usr/include/seccomp.h ]] || missing+=(libseccomp-dev)
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "node toolchain: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

rm -rf "$bin.partial"
mkdir -p "$bin.partial/cni"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
start=$(date +%s)
last=$start
took() { # took WHAT: how long the step just ended took, for the cold figures
  local now
  now=$(date +%s)
  echo "  $1 in $((now - last))s" >&2
  last=$now
}
install() { # install DIR [go install args...]
  local dir="$1"
  shift
  GOBIN="$dir" go install -trimpath -ldflags "-s -w" "$@" >&2
}
echo "building containerd $CONTAINERD_VERSION" >&2
# Only the snapshotters and plugins a kubelet's node uses here (overlayfs,
# native, CRI): the others are minutes of compiling on two cores.
CGO_ENABLED=0 install "$bin.partial" -tags "no_btrfs no_devmapper no_zfs no_tracing" \
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
took containerd
echo "building runc $RUNC_VERSION" >&2
CGO_ENABLED=1 install "$bin.partial" -tags seccomp "github.com/opencontainers/runc@$RUNC_VERSION"
took runc
echo "building the CNI plugins $CNI_PLUGINS_VERSION and crictl $CRICTL_VERSION" >&2
for p in main/bridge main/loopback ipam/host-local meta/portmap; do
  CGO_ENABLED=0 install "$bin.partial/cni" "github.com/containernetworking/plugins/plugins/$p@$CNI_PLUGINS_VERSION"
done
CGO_ENABLED=0 install "$bin.partial" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
took "CNI plugins and crictl"

echo "building kubelet and kube-proxy $K8S_VERSION" >&2
minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
# One build for both: their shared packages compile once, and the two
# links run side by side.
(
  cd "$here/kubelet"
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin.partial/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy >&2
)
took "kubelet and kube-proxy"
echo "building pause $PAUSE_VERSION (C, static)" >&2
k8s_src="$(cd "$here/kubelet" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION" -o "$bin.partial/pause" "$k8s_src/build/pause/linux/pause.c"
strip "$bin.partial/pause"
took pause
echo "building flotilla-image" >&2
(cd "$here/image" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin.partial/flotilla-image" .) >&2
took flotilla-image
echo "$PAUSE_VERSION" >"$bin.partial/pause.version"

rm -rf "$bin"
mv "$bin.partial" "$bin"
echo "node toolchain built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
