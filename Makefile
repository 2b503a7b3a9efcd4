# Flotilla: the two commands a new machine needs are `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CLUSTERS ?= 3

.PHONY: help deps toolchain build image api-clients api-baseline fleet-up fleet-down fleet-status test unit demo demo-pods lint crd bench-reconcile bench-failover bench-fleet bench-latency bench-churn bench-names bench-registry bench-status-api bench-authz bench-dashboard bench-scale bench-rollouts bench-dns bench-failover-workload bench-notes bench chaos

help:
	@echo "make test        install what is missing, start the local fleet, run every test, stop the fleet"
	@echo "make demo        start the local fleet and show it"
	@echo "make demo-pods   the same fleet with the operator as Pods on a real node (kubectl apply -k)"
	@echo "make image       the container image, without a container engine (target/image)"
	@echo "make fleet-up    start the local fleet ($(CLUSTERS) members + home)"
	@echo "make fleet-down  stop the local fleet"
	@echo "make lint        cargo fmt --check and clippy -D warnings"
	@echo "make chaos       random faults against the fleet under a workload, invariants checked (CHAOS_SECONDS, CHAOS_SEED)"

deps:
	@integration/install-deps

toolchain: deps
	@integration/toolchain/build.sh >/dev/null

build: deps
	cargo build --locked

fleet-up: toolchain
	integration/fleet up --clusters $(CLUSTERS)

fleet-down:
	integration/fleet down

fleet-status:
	integration/fleet status

lint:
	cargo fmt --check
	cargo clippy --locked --all-targets -- -D warnings

# Everything, on a fresh machine: the fleet is stopped even when tests fail.
test: toolchain
	integration/run-tests

unit:
	cargo test --locked --bins --lib

demo: toolchain
	integration/demo

demo-pods: toolchain
	integration/demo-pods

# A static binary in an OCI image with no base layer: target/image/oci and
# target/image/flotilla.tar; prints the digest.
image: deps
	integration/image

# The Go and Python stubs in clients/, generated from proto/ (#61); make
# test fails when the committed ones drift.
api-clients:
	integration/api/check --write

# The breaking-change baseline: proto/ as released. Move it at a release
# only, never to make a change pass (docs/api.md, "Versioning").
api-baseline:
	"$$(integration/toolchain/api-tools.sh buf)" build proto -o proto/baseline/v1.binpb

# The CRDs and their field references (docs/crd-*.md) are generated from the
# Rust types; unit tests fail on drift.
crd:
	cargo run --quiet -- crd > deploy/crds/member/crd.yaml
	cargo run --quiet -- crd fleet > deploy/crds/home/crd.yaml
	cargo run --quiet -- crd --reference > docs/crd-microservice.md
	cargo run --quiet -- crd fleet --reference > docs/crd-fleetmicroservice.md

# The status API under ghz and tonic load; no fleet needed. ghz is installed
# from the Go module proxy when missing.
bench-status-api: deps
	command -v ghz >/dev/null || test -x "$$(go env GOPATH)/bin/ghz" || go install github.com/bojand/ghz/cmd/ghz@v0.121.0
	cargo bench --locked --bench status_api

# What Kubernetes-native authorization costs, against the fleet's home
# apiserver: cached calls (tonic and ghz) with the reviews they send, first
# calls, and how soon a revocation ends a watch.
bench-authz: toolchain
	command -v ghz >/dev/null || test -x "$$(go env GOPATH)/bin/ghz" || go install github.com/bojand/ghz/cmd/ghz@v0.121.0
	integration/fleet up
	cargo bench --locked --bench authz

# Reconcile throughput, API cost and memory on member-3 of a running fleet.
bench-reconcile: toolchain
	integration/fleet up
	cargo bench --locked --bench reconcile

# One scenario at a time, on a running fleet (`integration/fleet up`).
bench-failover: toolchain
	integration/fleet up
	cargo bench --locked --bench failover

bench-fleet: toolchain
	integration/fleet up
	cargo bench --locked --bench fleet_scale

bench-latency: toolchain
	integration/fleet up
	cargo bench --locked --bench latency

# Change-to-applied latency of both controllers over a sweep of rates.
bench-churn: toolchain
	integration/fleet up
	integration/bench/churn-sweep

# The reconciler's name cache at 5,000 foreign Deployments.
# The service registry: create to resolvable by DNS, steady-state writes,
# cleanup delay after an etcd outage (needs the fleet and its registry up).
bench-registry: toolchain
	cargo bench --locked --bench registry

# The dashboard in headless Chromium over 3 x 500 Microservices; no fleet needed.
bench-dashboard: deps
	cargo bench --locked --bench dashboard

# The test bed and the operator at 3, 20 and 50 real members (SCALE_SIZES),
# and a per-replica cost model fitted to them (.fleet/bench/scale.md). About
# 15 minutes; the fleet is left at the size it had before.
bench-scale: toolchain
	integration/fleet up
	cargo bench --locked --bench scale

# 100 FleetMicroservices released at once over 50 real members in 3 waves,
# clean and with one member black-holed (FLOTILLA_BENCH_ROLLOUTS,
# FLOTILLA_BENCH_MEMBERS; FLOTILLA_BENCH_ANALYSIS=1 adds a webhook check to
# each); .fleet/bench/rollouts.json. The fleet is put back
# at 3 members.
bench-rollouts: toolchain
	integration/fleet up
	cargo bench --locked --bench rollouts

# Health-aware fleet DNS: a member stopped to the fleet-wide answer without
# it (detection, window, write and CoreDNS apart; 10 trials), 20 blips
# shorter than the window, a kill -9 of the DNS writer, and registry writes
# over a steady 1,500 Microservices (FLOTILLA_BENCH_DNS_*);
# .fleet/bench/dns.json. About 15 minutes.
bench-dns: toolchain
	integration/fleet up
	integration/fleet registry up
	cargo bench --locked --bench dns

# Workload failover: a member stopped to its replacement Available (10
# trials at unreachableAfter 10s), 20 blips shorter than it (goal: no
# failover), and the objects moved when one of 50 members leaves.
bench-failover-workload: toolchain
	integration/fleet up
	cargo bench --locked --bench failover_workload

# Fleet chaos (integration/chaos/): a nemesis mixing faults at random from a
# seed while a workload runs, then every invariant checked from the
# apiservers' audit logs. CHAOS_SECONDS (default 300) and CHAOS_SEED
# (default random; always printed, and a failed run prints the command that
# replays it). `make test` runs 120 s on the seed of the day.
chaos: toolchain
	integration/fleet up
	integration/fleet registry up
	CHAOS_SECONDS=$${CHAOS_SECONDS:-300} CHAOS_SEED=$${CHAOS_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')} \
	  cargo test --locked --test chaos -- chaos_run --nocapture

# 10,000 Microservices created, reconciled and deleted under one controller
# (FLOTILLA_BENCH_CYCLES): its resident memory every 1,000 and its note maps
# after the next prune, which must be empty; .fleet/bench/notes.json.
bench-notes: toolchain
	integration/fleet up
	cargo bench --locked --bench notes

bench-names: toolchain
	integration/fleet up
	cargo bench --locked --bench name_cache

# Every scenario, Flotilla beside client-go's sample-controller where both
# apply, then one table (.fleet/bench/summary.md). About 50 minutes on two
# cores; knobs are listed in integration/bench/run.
bench: toolchain
	integration/bench/run
