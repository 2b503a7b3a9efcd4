# A real node in the home cluster, sourced by integration/fleet (its process
# helpers and paths): containerd and runc, the CNI bridge, a kubelet that
# registers "flotilla-node", and kube-proxy. kwok keeps faking every other
# node; this one runs real containers, and carries a taint only the
# operator's Pods tolerate.
#
# The network never leaves the machine: the Pods live on the bridge
# flotilla0 (10.88.0.0/24, the host is 10.88.0.1), with no route out
# (forwarding off the bridge is dropped). kube-proxy (iptables) serves the
# home cluster's Services. The test bed's apiservers listen on 127.0.0.1
# only, so:
# - the `kubernetes` Service's EndpointSlice names 10.88.0.1, where socat
#   forwards to the home apiserver (the apiservers run with no endpoint
#   reconciler, and an endpoint may not be a loopback address);
# - the host maps 10.88.0.1:<member apiserver port> to 127.0.0.1 (DNAT, with
#   route_localnet on the bridge), for the member kubeconfigs the Pods read.
# See integration/README.md.

NODE_NAME=flotilla-node
NODE_BRIDGE=flotilla0
NODE_GATEWAY=10.88.0.1
NODE_SUBNET=10.88.0.0/24
SERVICE_RANGE=10.96.0.0/16 # the apiservers' --service-cluster-ip-range; the Pods' only route
NODE_TAINT=platform.example.io/operator-node
node_dir="$fleet/node"

node_bin() { "$root/integration/toolchain/node.sh"; }

# iptables rules this node adds; node_down deletes exactly these.
node_rules() {
  echo "nat PREROUTING -i $NODE_BRIDGE -d $NODE_GATEWAY -p tcp --dport $PORT_BASE:$((PORT_BASE + 999)) -j DNAT --to-destination 127.0.0.1"
  echo "filter FORWARD -i $NODE_BRIDGE ! -o $NODE_BRIDGE -j DROP"
  echo "filter FORWARD -o $NODE_BRIDGE ! -i $NODE_BRIDGE -j DROP"
}

node_network_up() {
  if ! ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    ip link add "$NODE_BRIDGE" type bridge
    ip addr add "$NODE_GATEWAY/24" dev "$NODE_BRIDGE"
  fi
  ip link set "$NODE_BRIDGE" up
  echo 1 >"/proc/sys/net/ipv4/conf/$NODE_BRIDGE/route_localnet"
  local table rule
  while read -r table rule; do
    # shellcheck disable=SC2086
    iptables -t "$table" -C $rule 2>/dev/null || iptables -t "$table" -I $rule
  done < <(node_rules)
}

node_network_down() {
  local table rule
  while read -r table rule; do
    # shellcheck disable=SC2086
    while iptables -t "$table" -C $rule 2>/dev/null; do iptables -t "$table" -D $rule; done
  done < <(node_rules)
  ip link del "$NODE_BRIDGE" 2>/dev/null || true
}

# What the kubelet (KUBE-FIREWALL, its canaries) and kube-proxy leave in
# iptables after `kube-proxy --cleanup`: the jumps from the built-in chains
# first, then the chains (no other kubelet runs on a test bed machine).
node_kube_chains_down() {
  local t line jumps chains
  for t in filter nat mangle; do
    jumps="$(iptables -t "$t" -S 2>/dev/null | grep -E '^-A [A-Z]+ -j KUBE-[A-Z-]+$' || true)"
    chains="$(iptables -t "$t" -S 2>/dev/null | sed -n 's/^-N \(KUBE-.*\)/\1/p')"
    while read -r line; do
      # shellcheck disable=SC2086
      if [[ -n "$line" ]]; then iptables -t "$t" -D ${line#-A }; fi
    done <<<"$jumps"
    for line in $chains; do iptables -t "$t" -F "$line"; done
    for line in $chains; do iptables -t "$t" -X "$line"; done
  done
}

node_pki() {
  [[ -f "$node_dir/pki/kubelet.crt" ]] && return 0
  mkdir -p "$node_dir/pki"
  (
    cd "$node_dir/pki"
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:nodes/CN=system:node:$NODE_NAME" \
      -keyout kubelet.key -out kubelet.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth,serverAuth\nsubjectAltName=IP:%s,DNS:%s\n' "$NODE_GATEWAY" "$NODE_NAME" >kubelet.ext
    openssl x509 -req -in kubelet.csr -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 3650 \
      -extfile kubelet.ext -out kubelet.crt 2>/dev/null
    rm -f kubelet.csr kubelet.ext
  )
}

node_configs() {
  local nb="$1" home_port
  home_port="$(apiserver_port home)"
  mkdir -p "$node_dir/cni" "$node_dir/kubelet"
  cat >"$node_dir/containerd.toml" <<EOF
version = 3
root = "$node_dir/containerd"
state = "$node_dir/run/containerd"
[grpc]
  address = "$node_dir/run/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "flotilla.local/pause:$(cat "$nb/pause.version")"
# No CAP_SYS_RESOURCE here: a container's oom_score_adj cannot go below
# containerd's own (the kubelet asks -998 for a sandbox).
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "$nb/runc"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$nb/cni"]
    conf_dir = "$node_dir/cni"
EOF
  cat >"$node_dir/cni/10-flotilla.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "flotilla-node",
  "plugins": [
    {
      "type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "dataDir": "$node_dir/cni-ipam",
               "ranges": [[{"subnet": "$NODE_SUBNET", "gateway": "$NODE_GATEWAY"}]],
               "routes": [{"dst": "$SERVICE_RANGE"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  cat >"$node_dir/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: home
  cluster:
    server: https://127.0.0.1:$home_port
    certificate-authority: $pki/ca.crt
users:
- name: kubelet
  user:
    client-certificate: $node_dir/pki/kubelet.crt
    client-key: $node_dir/pki/kubelet.key
contexts:
- name: home
  context: {cluster: home, user: kubelet}
current-context: home
EOF
  # cgroup v1 without systemd: the cgroupfs driver, and failCgroupV1 off
  # (kubelet 1.35+ refuses v1 unless told). No cluster DNS: the operator
  # resolves nothing. Evictions only at the brink: the disk is shared.
  cat >"$node_dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$node_dir/run/containerd.sock
address: $NODE_GATEWAY
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $((PORT_BASE + 5))
tlsCertFile: $node_dir/pki/kubelet.crt
tlsPrivateKeyFile: $node_dir/pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
registerWithTaints:
  - {key: $NODE_TAINT, value: "true", effect: NoSchedule}
resolvConf: ""
failSwapOn: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
  cat >"$node_dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $node_dir/kubelet.kubeconfig}
hostnameOverride: $NODE_NAME
clusterCIDR: $NODE_SUBNET
bindAddress: $NODE_GATEWAY
healthzBindAddress: 127.0.0.1:$((PORT_BASE + 6))
metricsBindAddress: 127.0.0.1:$((PORT_BASE + 7))
nodePortAddresses: ["$NODE_SUBNET"]
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0}
EOF
}

kubernetes_endpoints() {
  cat <<EOF
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels:
    kubernetes.io/service-name: kubernetes
    endpointslice.kubernetes.io/managed-by: fleet-node.flotilla.local
addressType: IPv4
endpoints:
  - addresses: ["$NODE_GATEWAY"]
    conditions: {ready: true}
ports:
  - {name: https, port: $(apiserver_port home), protocol: TCP}
EOF
}

node_import() { # node_import NB TARBALL...
  local nb="$1" t
  shift
  for t in "$@"; do
    "$nb/ctr" -a "$node_dir/run/containerd.sock" -n k8s.io images import "$t" >/dev/null
  done
}

node_images() { # writes the pause image's tarball; prints its path
  local nb="$1" v
  v="$(cat "$nb/pause.version")"
  mkdir -p "$node_dir/images"
  "$nb/flotilla-image" -name "flotilla.local/pause:$v" -layout "$node_dir/images/pause" \
    -tar "$node_dir/images/pause.tar" -entrypoint /pause -user 65535:65535 "/pause=$nb/pause" >/dev/null
  echo "$node_dir/images/pause.tar"
}

node_up() {
  local bin nb kc
  bin="$(cat "$fleet/bindir" 2>/dev/null)" || die "the fleet is not up"
  kc="$kubeconfigs/home.yaml"
  apiserver_ready home || die "the home apiserver is not ready"
  nb="$(node_bin)"
  node_pki
  node_configs "$nb"
  node_network_up
  start_proc node-apiserver-forward "$(command -v socat)" \
    "TCP-LISTEN:$(apiserver_port home),bind=$NODE_GATEWAY,fork,reuseaddr" "TCP:127.0.0.1:$(apiserver_port home)"
  PATH="$nb:$PATH" start_proc node-containerd "$nb/containerd" --config "$node_dir/containerd.toml"
  for _ in $(seq 1 100); do
    "$nb/ctr" -a "$node_dir/run/containerd.sock" version >/dev/null 2>&1 && break
    still_alive node-containerd || die "containerd exited; see $logs/node-containerd.log"
    sleep 0.2
  done
  node_import "$nb" "$(node_images "$nb")"
  # The kubelet acts as system:node:<name>; this test bed has no Node
  # authorizer, so its group gets the node role by RBAC.
  # kube-proxy runs as the node too.
  local role
  for role in system:node system:node-proxier; do
    "$bin/kubectl" --kubeconfig "$kc" create clusterrolebinding "flotilla-node-${role#system:}" --clusterrole "$role" \
      --group system:nodes --dry-run=client -o yaml | "$bin/kubectl" --kubeconfig "$kc" apply -f - >/dev/null
  done
  kubernetes_endpoints | "$bin/kubectl" --kubeconfig "$kc" apply -f - >/dev/null
  PATH="$nb:$PATH" start_proc node-kubelet "$nb/kubelet" --config "$node_dir/kubelet.yaml" \
    --kubeconfig "$node_dir/kubelet.kubeconfig" --root-dir "$node_dir/kubelet" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_GATEWAY" \
    --node-labels "platform.example.io/node=real" --v 1
  start_proc node-kube-proxy "$nb/kube-proxy" --config "$node_dir/kube-proxy.yaml" --v 1
  for _ in $(seq 1 300); do
    if [[ "$("$bin/kubectl" --kubeconfig "$kc" get node "$NODE_NAME" \
      -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]; then
      log "node: $NODE_NAME Ready (containerd, runc, kubelet from $nb)"
      return 0
    fi
    still_alive node-kubelet || die "the kubelet exited; see $logs/node-kubelet.log"
    sleep 0.2
  done
  die "node: $NODE_NAME not Ready after 60s; see $logs/node-kubelet.log"
}

# The kubelet first, so it restarts nothing; then every pod sandbox (their
# shims exit with them), containerd, the mounts left under the node's
# directory, the cgroups the kubelet made, and the network.
node_down() {
  local nb="" sock="$node_dir/run/containerd.sock"
  [[ -d "$node_dir" ]] || return 0
  stop_proc node-kubelet
  stop_proc node-kube-proxy
  nb="$(dirname "$(awk '{print $2}' "$run/node-containerd.pid" 2>/dev/null)")"
  if still_alive node-containerd && [[ -x "$nb/crictl" ]]; then
    "$nb/crictl" --runtime-endpoint "unix://$sock" --timeout 20s rmp -fa >/dev/null 2>&1 || true
  fi
  stop_proc node-containerd
  stop_proc node-apiserver-forward
  if [[ -x "$nb/kube-proxy" ]]; then "$nb/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
  local m
  for m in $(awk -v d="$node_dir" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  local c
  for c in /sys/fs/cgroup/*/kubepods; do
    [[ -d "$c" ]] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  node_kube_chains_down
  node_network_down
  rm -rf "$node_dir"
  log "node: down"
}

cmd_node() {
  case "${1:-}" in
    up) node_up ;;
    down) node_down ;;
    import) shift; node_import "$(node_bin)" "$@" ;;
    crictl) shift; "$(node_bin)/crictl" --runtime-endpoint "unix://$node_dir/run/containerd.sock" --timeout 20s "$@" ;;
    *) die "usage: fleet node up | down | import TARBALL... | crictl ARGS..." ;;
  esac
}

# --- the operator as Pods (integration/pods) ---------------------------------

pods_dir="$fleet/pods"
# The Pods lead members of their own: apiservers only (their writes need no
# controller), which no other test stops, grows or shrinks, so the Pod tests
# can run beside the rest of `make test` (integration/run-tests).
# FLOTILLA_POD_MEMBERS="member-1 member-2 member-3" gives them the fleet's
# full members instead, where Deployments run (make demo-pods).
read -r -a POD_MEMBERS <<<"${FLOTILLA_POD_MEMBERS:-pods-1 pods-2 pods-3}"

pods_members_up() {
  local bin="$1" m
  for m in "${POD_MEMBERS[@]}"; do
    [[ "$m" == pods-* ]] || continue
    write_kubeconfig "$m"
    start_apiserver "$bin" "$m"
  done
  for m in "${POD_MEMBERS[@]}"; do
    wait_apiserver "$m"
    # What a platform team applies to each member first: the CRD, RBAC, admission.
    "$bin/kubectl" --kubeconfig "$kubeconfigs/$m.yaml" apply --server-side -k "$root/deploy/crds/member" >/dev/null
    "$bin/kubectl" --kubeconfig "$kubeconfigs/$m.yaml" apply -k "$root/deploy/member" >/dev/null
  done
}

# The Secrets deploy/home asks for: the gRPC certificate and token, and one
# kubeconfig Secret per member, naming the member as the Pods reach it
# (the first labelled ring=canary, as `fleet operator up` labels member-1).
pods_secrets() {
  local bin="$1" kc="$kubeconfigs/home.yaml" m port
  mkdir -p "$pods_dir"
  if [[ ! -f "$pods_dir/tls.crt" ]]; then
    (
      cd "$pods_dir"
      openssl req -newkey rsa:2048 -nodes -subj "/CN=flotilla-grpc" -keyout tls.key -out tls.csr 2>/dev/null
      printf 'subjectAltName=DNS:flotilla-grpc.flotilla-system.svc,DNS:flotilla-ui.flotilla-system.svc\nextendedKeyUsage=serverAuth\n' >tls.ext
      openssl x509 -req -in tls.csr -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 3650 \
        -extfile tls.ext -out tls.crt 2>/dev/null
      rm -f tls.csr tls.ext
      head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >token
      head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >write-token
    )
  fi
  "$bin/kubectl" --kubeconfig "$kc" apply -f "$root/deploy/home/namespace.yaml" >/dev/null
  {
    "$bin/kubectl" -n flotilla-system create secret tls flotilla-grpc-tls --cert "$pods_dir/tls.crt" \
      --key "$pods_dir/tls.key" --dry-run=client -o yaml
    echo ---
    "$bin/kubectl" -n flotilla-system create secret generic flotilla-grpc-token \
      --from-file "token=$pods_dir/token" --dry-run=client -o yaml
    echo ---
    "$bin/kubectl" -n flotilla-system create secret generic flotilla-grpc-write-token \
      --from-file "token=$pods_dir/write-token" --dry-run=client -o yaml
    for m in "${POD_MEMBERS[@]}"; do
      # Full members are registered below by `flotilla cluster add`.
      [[ $m != pods-* && -n "${FLOTILLA_BIN:-}" ]] && continue
      port="$(apiserver_port "$m")"
      sed "s|server: https://127.0.0.1:$port|server: https://$NODE_GATEWAY:$port|" "$kubeconfigs/$m.yaml" \
        >"$pods_dir/$m.yaml"
      echo ---
      "$bin/kubectl" -n flotilla-members create secret generic "$m" \
        --from-file "kubeconfig=$pods_dir/$m.yaml" --dry-run=client -o yaml |
        "$bin/kubectl" label --local -f - platform.example.io/member-cluster=true \
          $([[ $m == "${POD_MEMBERS[0]}" ]] && echo ring=canary) -o yaml
    done
  } | "$bin/kubectl" --kubeconfig "$kc" apply -f - >/dev/null
  # With FLOTILLA_BIN (make demo-pods), full members are registered as a
  # platform team would (docs/install.md): the member manifests and a token
  # of the member's own ServiceAccount, never the admin kubeconfig.
  # (pods-N members have no token controller: apiservers only.)
  if [[ -n "${FLOTILLA_BIN:-}" ]]; then
    for m in "${POD_MEMBERS[@]}"; do
      [[ $m == pods-* ]] && continue
      "$FLOTILLA_BIN" cluster add "$m" --member-kubeconfig "$kubeconfigs/$m.yaml" \
        --member-server "https://$NODE_GATEWAY:$(apiserver_port "$m")" --home-kubeconfig "$kc" \
        $([[ $m == "${POD_MEMBERS[0]}" ]] && echo --label ring=canary) >/dev/null ||
        die "flotilla cluster add $m failed"
    done
  fi
  # Members of an earlier `pods up` that this one does not name leave.
  local s
  for s in $("$bin/kubectl" --kubeconfig "$kc" -n flotilla-members get secret \
    -l platform.example.io/member-cluster=true -o name); do
    [[ " ${POD_MEMBERS[*]} " == *" ${s#secret/} "* ]] ||
      "$bin/kubectl" --kubeconfig "$kc" -n flotilla-members delete "$s" >/dev/null
  done
}

pods_up() {
  local bin image="${1:-${CARGO_TARGET_DIR:-$root/target}/image/flotilla.tar}"
  bin="$(cat "$fleet/bindir" 2>/dev/null)" || die "the fleet is not up"
  still_alive node-kubelet || die "no real node: run 'integration/fleet node up' first"
  [[ -f "$image" ]] || die "no image at $image: run 'make image' first"
  node_import "$(node_bin)" "$image"
  pods_members_up "$bin"
  pods_secrets "$bin"
  "$bin/kubectl" --kubeconfig "$kubeconfigs/home.yaml" apply --server-side -k "$root/deploy/crds/home" >/dev/null
  # Server-side, as a manager of its own: a later server-side apply of
  # deploy/home (deploy.rs) then leaves the fields only this overlay sets.
  "$bin/kubectl" --kubeconfig "$kubeconfigs/home.yaml" apply --server-side --force-conflicts \
    --field-manager flotilla-test-bed -k "$root/integration/pods" >/dev/null
  "$bin/kubectl" --kubeconfig "$kubeconfigs/home.yaml" -n flotilla-system rollout status deploy/flotilla \
    --timeout 180s >&2 || die "the operator's Pods did not become Ready; see kubectl -n flotilla-system describe pods"
  log "pods: deploy/flotilla Ready in the home cluster"
}

pods_down() {
  local bin
  bin="$(cat "$fleet/bindir" 2>/dev/null)" || return 0
  "$bin/kubectl" --kubeconfig "$kubeconfigs/home.yaml" delete -k "$root/integration/pods" \
    --ignore-not-found --wait --timeout 90s >/dev/null 2>&1 || true
  local m
  for m in "${POD_MEMBERS[@]}"; do
    [[ "$m" == pods-* ]] || continue
    stop_proc "$m-apiserver"
    rm -f "$kubeconfigs/$m.yaml"
  done
  rm -rf "$pods_dir"
  log "pods: down"
}

cmd_pods() {
  case "${1:-}" in
    up) shift; pods_up "$@" ;;
    down) pods_down ;;
    *) die "usage: fleet pods up [IMAGE_TARBALL] | down" ;;
  esac
}
