"""The wire contract (proto/gpuprobe/v1, docs/wire.md): generated code, lint, and message behaviour."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor

from gpuprobe.fields import GPU_FIELDS
from gpuprobe.v1 import common_pb2, control_pb2, telemetry_pb2, telemetry_pb2_grpc

REPO = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO / "proto"
PROTOGEN = REPO / "tools" / "protogen.py"
BUF = REPO / "node_modules" / ".bin" / "buf"


def run_protogen(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROTOGEN), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def run_buf(*args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    if not BUF.exists():
        pytest.fail(f"buf is not installed at {BUF}: run `npm ci` in the repo root (package.json pins it)")
    env = {**os.environ, "BUF_CACHE_DIR": str(cache)}
    return subprocess.run([str(BUF), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False, env=env)


@pytest.fixture
def contract_copy(tmp_path: Path) -> Path:
    """A scratch repo holding copies of proto/ and the committed packages generated from it (gpuprobe/v1, and
    gpuprobe/kubelet from the vendored kubelet API)."""
    root = tmp_path / "repo"
    shutil.copytree(PROTO_DIR, root / "proto")
    for package in sorted(p.name for p in (PROTO_DIR / "gpuprobe").iterdir() if p.is_dir()):
        shutil.copytree(
            REPO / "gpuprobe" / package, root / "gpuprobe" / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return root


# --- generated code --------------------------------------------------------------------------


def test_committed_generated_code_is_current() -> None:
    result = run_protogen("--check")
    assert result.returncode == 0, f"stale generated code:\n{result.stdout}{result.stderr}"
    assert "up to date" in result.stdout


def test_check_reports_a_changed_proto_as_stale_until_regenerated(contract_copy: Path) -> None:
    proto_dir, out = contract_copy / "proto", contract_copy
    assert run_protogen("--check", "--proto-dir", proto_dir, "--out", out).returncode == 0

    telemetry = proto_dir / "gpuprobe" / "v1" / "telemetry.proto"
    text = telemetry.read_text(encoding="utf-8")
    anchor = "  optional double pcie_rx_bytes_per_s = 18;\n"
    assert anchor in text
    telemetry.write_text(
        text.replace(anchor, anchor + "  // Added in a test.\n  optional double extra_w = 999;\n"),
        encoding="utf-8",
    )

    stale = run_protogen("--check", "--proto-dir", proto_dir, "--out", out)
    assert stale.returncode == 1
    assert "gpuprobe/v1/telemetry_pb2.py" in stale.stderr
    assert "gpuprobe/v1/telemetry_pb2.pyi" in stale.stderr
    assert "gpuprobe/v1/common_pb2.py" not in stale.stderr
    assert "make proto" in stale.stderr
    # --check writes nothing.
    assert b"extra_w" not in (out / "gpuprobe" / "v1" / "telemetry_pb2.py").read_bytes()

    regenerated = run_protogen("--proto-dir", proto_dir, "--out", out)
    assert regenerated.returncode == 0, regenerated.stderr
    assert b"extra_w" in (out / "gpuprobe" / "v1" / "telemetry_pb2.py").read_bytes()
    assert run_protogen("--check", "--proto-dir", proto_dir, "--out", out).returncode == 0
    # The real repo was not touched.
    assert b"extra_w" not in (REPO / "gpuprobe" / "v1" / "telemetry_pb2.py").read_bytes()


def test_check_reports_missing_and_leftover_generated_files(contract_copy: Path) -> None:
    proto_dir, out = contract_copy / "proto", contract_copy
    package = out / "gpuprobe" / "v1"
    (package / "control_pb2_grpc.py").unlink()
    (package / "retired_pb2.py").write_text("# generated from a .proto that no longer exists\n")

    stale = run_protogen("--check", "--proto-dir", proto_dir, "--out", out)
    assert stale.returncode == 1
    assert "gpuprobe/v1/control_pb2_grpc.py: missing" in stale.stderr
    assert "gpuprobe/v1/retired_pb2.py: no longer generated" in stale.stderr

    assert run_protogen("--proto-dir", proto_dir, "--out", out).returncode == 0
    assert (package / "control_pb2_grpc.py").is_file()
    assert not (package / "retired_pb2.py").exists()
    assert (package / "__init__.py").is_file()
    assert run_protogen("--check", "--proto-dir", proto_dir, "--out", out).returncode == 0


def test_protogen_fails_clearly_on_a_broken_proto(contract_copy: Path) -> None:
    broken = contract_copy / "proto" / "gpuprobe" / "v1" / "common.proto"
    broken.write_text(broken.read_text(encoding="utf-8") + "\nmessage Broken { nonsense }\n")
    result = run_protogen("--check", "--proto-dir", contract_copy / "proto", "--out", contract_copy)
    assert result.returncode == 2
    assert "protoc failed" in result.stderr


# --- buf lint --------------------------------------------------------------------------------


def test_buf_lint_passes(tmp_path: Path) -> None:
    result = run_buf("lint", cwd=PROTO_DIR, cache=tmp_path / "buf-cache")
    assert result.returncode == 0, f"buf lint:\n{result.stdout}{result.stderr}"


def test_buf_lint_requires_a_comment_on_every_field(contract_copy: Path, tmp_path: Path) -> None:
    common = contract_copy / "proto" / "gpuprobe" / "v1" / "common.proto"
    common.write_text(
        common.read_text(encoding="utf-8") + "\n// Documented.\nmessage Undocumented {\n  int64 x = 1;\n}\n"
    )
    result = run_buf("lint", cwd=contract_copy / "proto", cache=tmp_path / "buf-cache")
    assert result.returncode != 0
    assert 'Field "x" should have a non-empty comment' in result.stdout


# --- message behaviour -----------------------------------------------------------------------

# free text whose empty value means "absent" (the field is then not written); every other field of
# the catalogue (gpuprobe/fields.py) is presence-tracked
GPU_SCHEMA_TEXT = {"health_reason"}
GPU_SCHEMA_FIELDS = {f.name for f in GPU_FIELDS} - GPU_SCHEMA_TEXT
SCHEMA_DOC = Path(__file__).resolve().parents[1] / "docs" / "schema.md"


def test_every_measured_gpu_field_of_the_storage_schema_can_be_absent() -> None:
    fields = {f.name: f for f in telemetry_pb2.GpuSample.DESCRIPTOR.fields}
    assert set(fields) == GPU_SCHEMA_FIELDS | GPU_SCHEMA_TEXT | {"time_unix_ns", "gpu_index"}
    assert [name for name in GPU_SCHEMA_FIELDS if not fields[name].has_presence] == []
    assert all(fields[name].type == fields[name].TYPE_STRING for name in GPU_SCHEMA_TEXT)
    # the enum's zero is "not judged", never stored
    assert common_pb2.GpuHealth.Name(0) == "GPU_HEALTH_UNSPECIFIED"
    for message in (telemetry_pb2.NodeSample, telemetry_pb2.AcousticSample):
        measured = [f for f in message.DESCRIPTOR.fields if f.name not in {"time_unix_ns", "source"}]
        assert all(f.has_presence or f.message_type is not None for f in measured), message
    # the measured fields of the health messages (not their keys: GPU, time, link, pid, instance) can
    # be absent too; proto3 strings are absent when empty, `ended` is a flag that is always written
    keys = {"time_unix_ns", "gpu_index", "pid", "link", "gpu_instance_id", "kind", "data", "ended"}
    for message in (
        telemetry_pb2.GpuEvent,
        telemetry_pb2.ProcessSample,
        telemetry_pb2.NvLinkSample,
        telemetry_pb2.MigSample,
    ):
        measured = [f for f in message.DESCRIPTOR.fields if f.name not in keys and f.type != f.TYPE_STRING]
        assert all(f.has_presence for f in measured), message
    for message in (common_pb2.GpuInfo,):
        assert all(message.DESCRIPTOR.fields_by_name[name].has_presence for name in ("mig_enabled", "gpm_supported"))


def test_every_gpu_health_message_field_is_in_the_storage_schema_with_its_type() -> None:
    """docs/schema.md lists the health messages' fields in their measurements' tables, with the type the
    proto gives them (GpuSample's fields and the gpu tables: tests/test_fields.py)."""
    text = SCHEMA_DOC.read_text(encoding="utf-8")

    def documented(measurement: str) -> dict[str, str]:
        match = re.search(rf"^## `{measurement}`.*?(?=^## )", text, re.S | re.M)
        assert match, measurement
        rows = re.findall(r"^\| `([a-z0-9_]+)` \| (float|integer|boolean|string) \|", match.group(0), re.M)
        return dict(rows)

    def kind(field: FieldDescriptor) -> str:
        if field.type in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
            return "float"
        if field.type == field.TYPE_BOOL:
            return "boolean"
        if field.type in (field.TYPE_STRING, field.TYPE_ENUM):
            return "string"
        return "integer"

    renamed = {"gpu_instance_id": "gpu_instance"}
    tags = {"time_unix_ns", "gpu_index", "pid", "link", "kind", "data", "mig_uuid"}
    for measurement, message in (
        ("gpu_process", telemetry_pb2.ProcessSample),
        ("gpu_nvlink", telemetry_pb2.NvLinkSample),
        ("gpu_mig", telemetry_pb2.MigSample),
        ("gpu_event", telemetry_pb2.GpuEvent),
    ):
        table = documented(measurement)
        for field in message.DESCRIPTOR.fields:
            if field.name in tags or (measurement == "gpu_mig" and field.name == "gpu_instance_id"):
                continue
            assert table.get(renamed.get(field.name, field.name)) == kind(field), (measurement, field.name)
    for name in ("mig_enabled", "gpm_supported"):
        assert documented("gpu_info").get(name) == "boolean"


def test_sample_batch_round_trip_keeps_absent_fields_absent_and_zeros_present() -> None:
    batch = telemetry_pb2.SampleBatch(
        agent_id="node-a",
        seq=42,
        created_unix_ns=1_700_000_000_500_000_000,
        gpus=[telemetry_pb2.GpuRef(index=0, uuid="GPU-0000", name="NVIDIA H100 80GB HBM3")],
        gpu_samples=[
            telemetry_pb2.GpuSample(
                time_unix_ns=1_700_000_000_000_000_000,
                gpu_index=0,
                power_w=0.0,  # a real zero: present
                clock_event_reasons=0,  # no reason active: present
                temp_c=61.5,
                energy_j=123456.789,
                # fan_pct, mem_temp_c, power_instant_w...: unsupported, absent
            )
        ],
        node_samples=[
            telemetry_pb2.NodeSample(
                time_unix_ns=1_700_000_000_000_000_000,
                cpu_pct=0.0,
                hwmon_temp_c={"coretemp_package_id_0": 48.0, "nvme_composite": 0.0},
            )
        ],
        acoustic_samples=[
            telemetry_pb2.AcousticSample(
                time_unix_ns=1_700_000_000_000_000_000,
                source=telemetry_pb2.ACOUSTIC_SOURCE_PROXY,
                gpu_index=0,
                est_dba=38.2,
                tdp_flag=False,
            )
        ],
        trainer_samples=[
            telemetry_pb2.TrainerSample(
                time_unix_ns=1_700_000_000_000_000_000,
                probe_id="p1",
                workload="matmul",
                gpu_index=0,
                step=0,
                samples_per_s=0.0,
                batch_size=64,
                phase=common_pb2.PROBE_PHASE_WARMUP,
            )
        ],
        probe_events=[
            telemetry_pb2.ProbeEvent(
                time_unix_ns=1_700_000_000_000_000_000,
                probe_id="p1",
                kind=telemetry_pb2.PROBE_EVENT_KIND_PHASE_CHANGE,
                phase=common_pb2.PROBE_PHASE_WARMUP,
                status=common_pb2.PROBE_STATUS_RUNNING,
            )
        ],
        stats=telemetry_pb2.AgentStats(dropped_samples=7),
    )
    wire = telemetry_pb2.StreamRequest(batch=batch).SerializeToString()
    request = telemetry_pb2.StreamRequest.FromString(wire)
    assert request.WhichOneof("kind") == "batch"
    got = request.batch
    assert got == batch
    assert (got.agent_id, got.seq, got.stats.dropped_samples) == ("node-a", 42, 7)

    gpu = got.gpu_samples[0]
    present = {name for name in GPU_SCHEMA_FIELDS if gpu.HasField(name)}
    assert present == {"power_w", "clock_event_reasons", "temp_c", "energy_j"}
    assert gpu.power_w == 0.0 and gpu.clock_event_reasons == 0
    assert not gpu.HasField("fan_pct") and not gpu.HasField("mem_temp_c")
    assert math.isclose(gpu.energy_j, 123456.789)

    node = got.node_samples[0]
    assert node.HasField("cpu_pct") and not node.HasField("load1") and not node.HasField("mem_used_bytes")
    assert dict(node.hwmon_temp_c) == {"coretemp_package_id_0": 48.0, "nvme_composite": 0.0}

    acoustic = got.acoustic_samples[0]
    assert acoustic.HasField("tdp_flag") and acoustic.tdp_flag is False
    assert acoustic.HasField("gpu_index") and not acoustic.HasField("laeq_db")

    trainer = got.trainer_samples[0]
    assert trainer.HasField("samples_per_s") and not trainer.HasField("loss")


def test_hello_carries_identity_inventory_and_resume_point() -> None:
    hello = telemetry_pb2.Hello(
        identity=common_pb2.AgentIdentity(
            agent_id="node-a",
            host="node-a",
            cluster="lab",
            cloud="aws",
            instance_type="p5.48xlarge",
            region="us-east-1",
            virtualization=common_pb2.VIRTUALIZATION_PASSTHROUGH,
        ),
        agent_version="0.1.0",
        sample_interval_s=0.1,
        gpus=[
            common_pb2.GpuInfo(
                index=0,
                uuid="GPU-0000",
                name="NVIDIA H100 80GB HBM3",
                pci_bus_id="00000000:18:00.0",
                memory_total_bytes=80 * 2**30,
                power_limit_default_w=700.0,
                temp_slowdown_c=87.0,
                fan_count=0,
                passive_cooling=True,
            )
        ],
        spool_id="3f1c",
        oldest_unacked_seq=40,
        newest_unacked_seq=42,
    )
    got = telemetry_pb2.StreamRequest.FromString(telemetry_pb2.StreamRequest(hello=hello).SerializeToString())
    assert got.WhichOneof("kind") == "hello"
    gpu = got.hello.gpus[0]
    assert gpu.HasField("fan_count") and gpu.fan_count == 0
    assert not gpu.HasField("temp_shutdown_c") and not gpu.HasField("power_limit_max_w")
    assert got.hello.newest_unacked_seq == 42


def _command() -> control_pb2.Command:
    return control_pb2.Command(
        command_id="0b6f6a34-6f0e-4a5e-9d0e-6b0d7c1f2a11",
        issued_at_unix_ns=1_700_000_000_000_000_000,
        expires_at_unix_ns=1_700_000_600_000_000_000,
        issuer="alice",
        probe_start=control_pb2.ProbeStart(
            probe_id="p1",
            workload="resnet50",
            size=control_pb2.WORKLOAD_SIZE_TINY,
            start_at_unix_ns=1_700_000_030_000_000_000,
            duration_s=120.0,
            batch_size=0,
            selector=control_pb2.NodeSelector(instance_types=["p5.48xlarge"], regions=["us-east-1"]),
            gpu_indices=[0, 2],
        ),
    )


def test_command_and_signed_command_round_trip() -> None:
    command = _command()
    payload = command.SerializeToString()
    signed = control_pb2.SignedCommand(payload=payload, signature=b"\x01" * 64, key_id="0123456789abcdef")

    got = control_pb2.SignedCommand.FromString(signed.SerializeToString())
    assert got.payload == payload  # the signed bytes travel unchanged
    assert (got.signature, got.key_id) == (b"\x01" * 64, "0123456789abcdef")

    parsed = control_pb2.Command.FromString(got.payload)
    assert parsed == command
    assert parsed.WhichOneof("action") == "probe_start"
    start = parsed.probe_start
    assert start.HasField("batch_size") and start.batch_size == 0
    assert not start.HasField("warmup_s")
    assert list(start.gpu_indices) == [0, 2]
    assert not start.selector.all_agents

    cancel = control_pb2.Command(command_id="c2", probe_cancel=control_pb2.ProbeCancel(probe_id="p1"))
    assert control_pb2.Command.FromString(cancel.SerializeToString()).WhichOneof("action") == "probe_cancel"


def test_ed25519_signature_covers_exactly_the_payload_bytes() -> None:
    reason = "cryptography comes with the agent and collector extras"
    ed25519 = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519", reason=reason)
    exceptions = pytest.importorskip("cryptography.exceptions", reason=reason)
    key = ed25519.Ed25519PrivateKey.generate()
    payload = _command().SerializeToString()
    signed = control_pb2.SignedCommand(payload=payload, signature=key.sign(payload), key_id="k")
    received = control_pb2.SignedCommand.FromString(signed.SerializeToString())
    key.public_key().verify(received.signature, received.payload)  # raises if it does not verify

    tampered = control_pb2.Command.FromString(received.payload)
    tampered.probe_start.workload = "rm -rf /"
    with pytest.raises(exceptions.InvalidSignature):
        key.public_key().verify(received.signature, tampered.SerializeToString())


def test_reply_presence_progress_and_result_round_trip() -> None:
    messages = [
        control_pb2.CommandReply(
            command_id="c1", host="node-a", accepted=False, reason=control_pb2.REFUSAL_REASON_REPLAYED
        ),
        control_pb2.AgentPresence(
            state=control_pb2.AGENT_STATE_LOST,
            identity=common_pb2.AgentIdentity(agent_id="node-a", host="node-a"),
            gpus=[common_pb2.GpuInfo(index=0, uuid="GPU-0000")],
            workloads=["matmul", "idle"],
        ),
        control_pb2.ProbeProgress(probe_id="p1", host="node-a", phase=common_pb2.PROBE_PHASE_STEADY, step=10),
        control_pb2.ProbeResult(
            probe_id="p1",
            host="node-a",
            status=common_pb2.PROBE_STATUS_SUCCEEDED,
            gpus=[control_pb2.ProbeMetrics(gpu_index=0, energy_j=0.0, samples=100)],
            total=control_pb2.ProbeMetrics(energy_j=5000.0),
        ),
    ]
    for message in messages:
        assert type(message).FromString(message.SerializeToString()) == message
    result = control_pb2.ProbeResult.FromString(messages[-1].SerializeToString())
    assert result.gpus[0].HasField("energy_j") and not result.gpus[0].HasField("peak_temp_c")
    assert not result.total.HasField("gpu_index")


# --- the service -----------------------------------------------------------------------------


def test_service_descriptor_has_the_bidi_stream_method() -> None:
    service = telemetry_pb2.DESCRIPTOR.services_by_name["TelemetryService"]
    assert service.full_name == "gpuprobe.v1.TelemetryService"
    assert [m.name for m in service.methods] == ["Stream"]
    method = service.methods_by_name["Stream"]
    assert method.client_streaming and method.server_streaming
    assert method.input_type is telemetry_pb2.StreamRequest.DESCRIPTOR
    assert method.output_type is telemetry_pb2.StreamResponse.DESCRIPTOR


# The generated *_pb2_grpc.py modules are untyped (protoc's gRPC plugin writes no stubs), hence the
# no-untyped-call ignores below.
class _AckingCollector(telemetry_pb2_grpc.TelemetryServiceServicer):
    """Welcomes the agent, then acks every batch (the protocol of docs/wire.md, minus the WAL)."""

    def Stream(
        self, request_iterator: Iterator[telemetry_pb2.StreamRequest], context: grpc.ServicerContext
    ) -> Iterator[telemetry_pb2.StreamResponse]:
        first = next(request_iterator)
        if first.WhichOneof("kind") != "hello":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "first message must be Hello")
        yield telemetry_pb2.StreamResponse(welcome=telemetry_pb2.Welcome(collector_id="c1"))
        for request in request_iterator:
            yield telemetry_pb2.StreamResponse(ack=telemetry_pb2.Ack(durable_seq=request.batch.seq))


@pytest.fixture
def collector_channel() -> Iterator[grpc.Channel]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(_AckingCollector(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        channel.close()
        server.stop(grace=None)


def test_generated_stub_streams_over_a_real_socket(collector_channel: grpc.Channel) -> None:
    stub = telemetry_pb2_grpc.TelemetryServiceStub(collector_channel)  # type: ignore[no-untyped-call]
    identity = common_pb2.AgentIdentity(agent_id="a")
    hello = telemetry_pb2.StreamRequest(hello=telemetry_pb2.Hello(identity=identity))
    batches = [telemetry_pb2.StreamRequest(batch=telemetry_pb2.SampleBatch(agent_id="a", seq=n)) for n in (1, 2)]
    responses = list(stub.Stream(iter([hello, *batches]), timeout=10))
    assert [r.WhichOneof("kind") for r in responses] == ["welcome", "ack", "ack"]
    assert [r.ack.durable_seq for r in responses[1:]] == [1, 2]
