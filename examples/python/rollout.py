#!/usr/bin/env python3
"""Release tooling's main flow against Flotilla's API, in Python.

Change a FleetMicroservice's image with kubectl, then wait over gRPC (TLS
and a bearer token) until the rollout of exactly that generation ends.
Errors are read from their google.rpc.Status details: the ErrorInfo reason
decides, and RetryInfo says whether and when to ask again.

Exit codes: 0 succeeded, 1 failed or rolled back, 2 deadline exceeded,
3 refused or unreachable, 64 usage.

Needs grpcio and grpcio-status, and the stubs in clients/python on
PYTHONPATH (`make api-clients` regenerates them).
"""
import argparse
import subprocess
import sys
import time

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from flotilla.v1 import rollouts_pb2, rollouts_pb2_grpc

RESULT = rollouts_pb2.FleetRolloutResult
PHASE = rollouts_pb2.RolloutPhase


def details(err):
    """(code, reason, retry seconds or None, message) of a failed call."""
    reason, retry = "", None
    status = rpc_status.from_call(err)
    if status is not None:
        for any_ in status.details:
            if any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                any_.Unpack(info)
                reason = info.reason
            elif any_.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                any_.Unpack(info)
                retry = info.retry_delay.ToTimedelta().total_seconds()
    return err.code(), reason, retry, err.details()


def apply(args):
    """The change, as release tooling makes it; returns the generation it made."""
    patch = '{"spec":{"template":{"image":"%s"}}}' % args.image
    out = subprocess.run(
        [args.kubectl, "--kubeconfig", args.kubeconfig, "-n", args.namespace,
         "patch", "fleetmicroservices.platform.example.io", args.name,
         "--type", "merge", "-p", patch, "-o", "jsonpath={.metadata.generation}"],
        check=True, capture_output=True, text=True, timeout=60)
    return int(out.stdout.strip())


def wait(stub, args, generation, deadline, token):
    """Follows one stream: (exit code, None) or (None, seconds to retry after)."""
    request = rollouts_pb2.WaitForFleetRolloutRequest(
        namespace=args.namespace, name=args.name, generation=generation,
        timeout=duration_pb2.Duration(seconds=max(1, int(deadline - time.monotonic()))))
    stream = stub.WaitForFleetRollout(
        request, metadata=[("authorization", "Bearer " + token)],
        timeout=deadline - time.monotonic() + 10)
    try:
        for p in stream:
            r = p.rollout
            print("%s  phase %s  clusters updated %d/%d available %d/%d  %s" % (
                RESULT.Name(p.result), PHASE.Name(r.rollout_phase),
                r.clusters_updated, r.clusters_placed,
                r.clusters_available, r.clusters_placed, p.summary), flush=True)
            if p.result == RESULT.FLEET_ROLLOUT_RESULT_SUCCEEDED:
                return 0, None
            if p.result in (RESULT.FLEET_ROLLOUT_RESULT_FAILED,
                            RESULT.FLEET_ROLLOUT_RESULT_ROLLED_BACK):
                return 1, None
            if p.result == RESULT.FLEET_ROLLOUT_RESULT_DEADLINE_EXCEEDED:
                return 2, None
    except grpc.RpcError as err:
        code, reason, retry, message = details(err)
        print("%s (%s): %s" % (code.name, reason, message), file=sys.stderr)
        return (3, None) if retry is None else (None, max(retry, 0.2))
    print("the stream ended before the rollout did", file=sys.stderr)
    return None, 1.0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", default="127.0.0.1:50051")
    p.add_argument("--ca", required=True, help="PEM of the CA that signed the server")
    p.add_argument("--server-name", default="", help="the name the certificate carries")
    p.add_argument("--token-file", required=True)
    p.add_argument("--kubectl", default="kubectl")
    p.add_argument("--kubeconfig", required=True, help="the home cluster's kubeconfig")
    p.add_argument("--namespace", default="default")
    p.add_argument("--name", required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--timeout", type=float, default=300, help="seconds")
    try:
        args = p.parse_args()
    except SystemExit:
        sys.exit(64)
    token = open(args.token_file).read().strip()
    try:
        generation = apply(args)
    except (subprocess.SubprocessError, ValueError) as e:
        print("kubectl patch: %s" % e, file=sys.stderr)
        sys.exit(3)
    print("applied %s to %s/%s: generation %d" % (
        args.image, args.namespace, args.name, generation), flush=True)
    options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
    creds = grpc.ssl_channel_credentials(root_certificates=open(args.ca, "rb").read())
    deadline = time.monotonic() + args.timeout
    with grpc.secure_channel(args.server, creds, options=options) as channel:
        stub = rollouts_pb2_grpc.FleetRolloutsStub(channel)
        while True:
            code, retry = wait(stub, args, generation, deadline, token)
            if code is not None:
                sys.exit(code)
            if time.monotonic() + retry >= deadline:
                print("deadline exceeded while retrying", file=sys.stderr)
                sys.exit(2)
            time.sleep(retry)


if __name__ == "__main__":
    main()
