"""Part: agent. Which pod holds which GPU: the kubelet's pod-resources API, asked every ``--pod-resources-interval``.

The kubelet serves ``v1.PodResourcesLister`` (gRPC) on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``); its ``List`` names, per pod and container, the
device ids each device plugin assigned. NVIDIA's device plugin uses the GPU UUIDs (``GPU-...``;
``GPU-...::N`` for a shared replica, ``MIG-...`` for a MIG device), so the assignment is kept by UUID:
:attr:`PodResources.assignments` maps a UUID to ``(pod, namespace, container)``, as dcgm-exporter's
``pod``, ``namespace`` and ``container`` labels. The mapping is replaced (a new object) only when the
answer changes, so that the Prometheus page rebuilds its labels only then.

When the kubelet does not answer, the last answer is kept (a kubelet restart is short and the pods
keep their GPUs meanwhile) and the failure is logged once until it answers again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path

import grpc

from gpuprobe.kubelet.v1 import podresources_pb2

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 5.0
LIST_METHOD = "/v1.PodResourcesLister/List"
RESOURCE_PREFIX = "nvidia.com/"  # nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...

PodRef = tuple[str, str, str]  # pod, namespace, container


def assignments_of(response: podresources_pb2.ListPodResourcesResponse) -> dict[str, PodRef]:
    """GPU UUID -> (pod, namespace, container) of one ``List`` answer."""
    out: dict[str, PodRef] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not devices.resource_name.startswith(RESOURCE_PREFIX):
                    continue
                for device_id in devices.device_ids:
                    out[device_id.split("::", 1)[0]] = (pod.name, pod.namespace, container.name)
    return out


class PodResources:
    """Asks the kubelet in a thread of its own; :attr:`assignments` is read by any thread."""

    def __init__(self, socket_path: Path, interval_s: float) -> None:
        self.socket_path = socket_path
        self.interval_s = interval_s
        self._assignments: Mapping[str, PodRef] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuprobe-pod-resources", daemon=True)
        self._failing = False

    def assignments(self) -> Mapping[str, PodRef]:
        return self._assignments

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(CALL_TIMEOUT_S + 1)

    def _run(self) -> None:
        channel = grpc.insecure_channel(f"unix:{self.socket_path}")
        call = channel.unary_unary(
            LIST_METHOD,
            request_serializer=podresources_pb2.ListPodResourcesRequest.SerializeToString,
            response_deserializer=podresources_pb2.ListPodResourcesResponse.FromString,
        )
        try:
            while not self._stop.is_set():
                self.refresh(call)
                self._stop.wait(self.interval_s)
        finally:
            channel.close()

    def refresh(self, call: grpc.UnaryUnaryMultiCallable) -> None:
        """One ``List`` call; the assignment replaced when it changed."""
        try:
            response = call(podresources_pb2.ListPodResourcesRequest(), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as e:
            if not self._failing:
                self._failing = True
                log.warning(
                    "the kubelet's pod-resources API at %s does not answer (%s): GPU metrics keep the pods last known",
                    self.socket_path,
                    e.code() if hasattr(e, "code") else e,
                )
            return
        if self._failing:
            self._failing = False
            log.info("the kubelet's pod-resources API at %s answers again", self.socket_path)
        fresh = assignments_of(response)
        if fresh != self._assignments:
            self._assignments = fresh
            log.info(
                "GPUs held by pods: %s", ", ".join(f"{u} {p[1]}/{p[0]}" for u, p in sorted(fresh.items())) or "none"
            )
