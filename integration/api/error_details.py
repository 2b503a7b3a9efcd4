#!/usr/bin/env python3
"""Calls a replica the ways that fail, and prints what each error's
google.rpc.Status details say, decoded with grpc_status.rpc_status.from_call
(one JSON object a line): the code, the ErrorInfo reason and domain, the
RetryInfo delay and the BadRequest fields. integration/tests/api_clients.rs
runs it against a replica started with --grpc-max-streams 2 and asserts.

  error_details.py SERVER CA TOKEN_FILE NAMESPACE
"""
import json
import sys

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from flotilla.v1 import fleet_pb2, fleet_pb2_grpc, rollouts_pb2, rollouts_pb2_grpc


def decoded(call, err):
    out = {"call": call, "code": err.code().name, "reason": None, "domain": None,
           "retry_seconds": None, "fields": []}
    status = rpc_status.from_call(err)
    for any_ in (status.details if status else []):
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.RetryInfo,
                     error_details_pb2.BadRequest):
            if any_.Is(kind.DESCRIPTOR):
                msg = kind()
                any_.Unpack(msg)
                if kind is error_details_pb2.ErrorInfo:
                    out["reason"], out["domain"] = msg.reason, msg.domain
                    out["metadata"] = dict(msg.metadata)
                elif kind is error_details_pb2.RetryInfo:
                    out["retry_seconds"] = msg.retry_delay.ToTimedelta().total_seconds()
                else:
                    out["fields"] = [v.field for v in msg.field_violations]
    return out


def main():
    server, ca, token_file, namespace = sys.argv[1:5]
    token = open(token_file).read().strip()
    auth = [("authorization", "Bearer " + token)]
    creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
    with grpc.secure_channel(server, creds) as channel:
        status = fleet_pb2_grpc.FleetStatusStub(channel)
        rollouts = rollouts_pb2_grpc.FleetRolloutsStub(channel)

        def attempt(call, fn):
            try:
                fn()
                print(json.dumps({"call": call, "code": "OK"}), flush=True)
            except grpc.RpcError as err:
                print(json.dumps(decoded(call, err)), flush=True)

        def first(stream):
            return next(iter(stream))

        attempt("unregistered-cluster", lambda: first(status.WaitForRollout(
            fleet_pb2.WaitForRolloutRequest(namespace=namespace, name="api", generation=1,
                                            clusters=["no-such-cluster"]),
            metadata=auth, timeout=20)))
        attempt("bad-page-token", lambda: status.ListMicroservices(
            fleet_pb2.ListMicroservicesRequest(page_token="zz"), metadata=auth, timeout=20))
        attempt("unknown-fleet-microservice", lambda: rollouts.GetRollout(
            rollouts_pb2.RolloutRef(namespace=namespace, name="no-such-rollout"),
            metadata=auth, timeout=20))
        attempt("wrong-token", lambda: rollouts.GetRollout(
            rollouts_pb2.RolloutRef(namespace=namespace, name="api"),
            metadata=[("authorization", "Bearer not-the-token")], timeout=20))
        # Hold the replica's two stream places, then ask for a third.
        held = [rollouts.WatchRollouts(rollouts_pb2.WatchRolloutsRequest(namespace=namespace),
                                       metadata=auth, timeout=60) for _ in range(2)]
        for h in held:
            first(h)
        attempt("stream-limit", lambda: first(rollouts.WatchRollouts(
            rollouts_pb2.WatchRolloutsRequest(namespace=namespace), metadata=auth, timeout=20)))
        for h in held:
            h.cancel()


if __name__ == "__main__":
    main()
