"""kcached as seen by gRPC clients kcache did not write.

PyPI's grpcio-reflection lists the services through server reflection
(v1alpha, what the daemon's gRPC 1.51 speaks), fetches kcache.v1's
descriptors and calls AdminService/Stats through a stub built from the
reflected descriptor alone (no .proto file, none of kcache's generated
modules); grpcio-health-checking's client calls grpc.health.v1.Health/Check.
The daemon is a real kcached in compile-only mode on a temporary store and
socket. Run by CTest (reflection_test, "pypi" environment), which sets
KCACHE_TEST_KCACHED.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase)

DEADLINE_S = 20


@pytest.fixture(scope="module")
def daemon():
    kcached = os.environ.get("KCACHE_TEST_KCACHED")
    if not kcached or not os.access(kcached, os.X_OK):
        pytest.fail("set KCACHE_TEST_KCACHED to a kcached binary (got %r)" % kcached)
    with tempfile.TemporaryDirectory(prefix="kcache-reflection-") as tmp:
        sock = os.path.join(tmp, "kcached.sock")
        log = open(os.path.join(tmp, "kcached.log"), "w+")
        proc = subprocess.Popen(
            [kcached, "--store_path=" + os.path.join(tmp, "store"), "--socket_path=" + sock,
             "--compile_only=true", "--compile_threads=1"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(600):
                if os.path.exists(sock) or proc.poll() is not None:
                    break
                time.sleep(0.1)
            if not os.path.exists(sock):
                log.seek(0)
                pytest.fail("kcached did not create its socket:\n" + log.read())
            channel = grpc.insecure_channel("unix://" + sock)
            yield channel
            channel.close()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, "kcached did not stop cleanly on SIGTERM"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()


def test_no_kcache_module_is_used():
    # The point of this test is a client that knows only what reflection says.
    assert not any(m == "kcache" or m.startswith("kcache.") for m in sys.modules)


def test_reflection_lists_the_services(daemon):
    services = ProtoReflectionDescriptorDatabase(daemon).get_services()
    for s in ("kcache.v1.KernelService", "kcache.v1.AdminService", "grpc.health.v1.Health"):
        assert s in services, "reflection does not list %s (got %s)" % (s, services)


def test_kernel_service_descriptor_has_its_methods(daemon):
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(daemon))
    methods = set(pool.FindServiceByName("kcache.v1.KernelService").methods_by_name)
    assert {"GetKernel", "GetKernelStream", "Prefetch"} <= methods, methods


def test_stats_through_the_reflected_descriptor(daemon):
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(daemon))
    method = pool.FindServiceByName("kcache.v1.AdminService").methods_by_name["Stats"]
    request_type = message_factory.GetMessageClass(method.input_type)
    response_type = message_factory.GetMessageClass(method.output_type)
    stats = daemon.unary_unary(
        "/kcache.v1.AdminService/Stats",
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString)(request_type(), timeout=DEADLINE_S)
    assert stats.compile_only is True, stats
    assert stats.entries == 0, stats


def test_health_check_serving(daemon):
    stub = health_pb2_grpc.HealthStub(daemon)
    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=DEADLINE_S)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
