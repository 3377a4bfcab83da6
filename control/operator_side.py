"""Part: control. The operator's side of the control plane: sign and publish commands, read presence, progress and
results.

All reads rely on retained messages (presence, progress, results), so a command run at any time
sees the current state: it subscribes, collects what the broker holds until the stream has been
quiet for a moment, and (for ``status`` and ``start``) keeps listening for live updates.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.message import DecodeError

from gpuprobe.control import mqtt, selector, signing, topics
from gpuprobe.v1 import common_pb2, control_pb2

SETTLE_S = 0.4  # retained messages arrive right after SUBACK; this much quiet means they are all here
SNAPSHOT_MAX_S = 5.0


@dataclass
class Received:
    topic: str
    payload: bytes


class Session:
    """One MQTT connection of the operator CLI."""

    def __init__(self, broker: mqtt.BrokerSettings) -> None:
        self.broker = broker
        self._client: Any = None
        self._messages: Any = None

    async def __aenter__(self) -> Session:
        self._client = mqtt.make_client(self.broker, identifier=None, keepalive=30)
        await self._client.__aenter__()
        self._messages = self._client.messages.__aiter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(Exception):
            await self._client.__aexit__(exc_type, exc, tb)

    async def subscribe(self, *filters: str) -> None:
        for f in filters:
            await self._client.subscribe(f, qos=1)

    async def next(self, timeout_s: float) -> Received | None:
        """The next message with a non-empty payload (an empty retained message clears a topic), or None."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                message = await asyncio.wait_for(self._messages.__anext__(), left)
            except TimeoutError:
                return None
            payload = message.payload
            if isinstance(payload, bytes | bytearray) and payload:
                return Received(str(message.topic), bytes(payload))

    async def snapshot(
        self, *filters: str, settle_s: float = SETTLE_S, max_s: float = SNAPSHOT_MAX_S
    ) -> list[Received]:
        """Everything retained under ``filters`` (what arrives until ``settle_s`` of quiet)."""
        await self.subscribe(*filters)
        out: list[Received] = []
        deadline = time.monotonic() + max_s
        while time.monotonic() < deadline:
            got = await self.next(settle_s)
            if got is None:
                break
            out.append(got)
        return out

    async def publish(self, topic: str, payload: bytes, message_name: str, expiry_s: int | None = None) -> None:
        await self._client.publish(
            topic, payload, qos=1, retain=False, properties=mqtt.publish_properties(message_name, expiry_s), timeout=10
        )


def parse(kind: type[Any], payload: bytes) -> Any:
    try:
        return kind.FromString(payload)
    except DecodeError:
        return None


async def fleet(session: Session) -> list[control_pb2.AgentPresence]:
    """The latest presence of every agent (live heartbeats may arrive while the retained ones do)."""
    latest: dict[str, control_pb2.AgentPresence] = {}
    for msg in await session.snapshot(topics.PRESENCE_ALL):
        parts = topics.split(msg.topic)
        presence = parse(control_pb2.AgentPresence, msg.payload)
        if presence is not None and len(parts) == 2:
            latest[parts[1]] = presence  # messages on one topic arrive in order: the last is the newest
    return [latest[host] for host in sorted(latest)]


def expected_hosts(presences: list[control_pb2.AgentPresence], node_selector: control_pb2.NodeSelector) -> set[str]:
    """Online agents the selector picks (those whose replies ``probe start`` waits for)."""
    return {
        p.identity.host
        for p in presences
        if p.state == control_pb2.AGENT_STATE_ONLINE and selector.match(node_selector, p.identity)[0]
    }


def no_agent_selected(presences: list[control_pb2.AgentPresence], node_selector: control_pb2.NodeSelector) -> str:
    """Why no online agent is selected: the selector, the online hosts it names but another term excludes,
    and the online hosts (a command is not sent then)."""
    online = [p for p in presences if p.state == control_pb2.AGENT_STATE_ONLINE]
    named = [p.identity.host for p in online if selector.match(node_selector, p.identity)[1]]
    hosts = ", ".join(p.identity.host for p in online) or "none"
    return (
        f"no online agent matches --nodes {selector.describe(node_selector)}, so nothing was sent"
        + (f" ({', '.join(named)}: named, but another term excludes it)" if named else "")
        + f"; online: {hosts} (`gpuprobe fleet` lists their labels)"
    )


def health_warnings(presences: list[control_pb2.AgentPresence], hosts: set[str], gpu_indices: list[int]) -> list[str]:
    """What ``probe start`` warns about before it sends: among ``hosts``, the selected GPUs (all of a
    host's when ``gpu_indices`` is empty) that the retained presence shows failed or degraded. The
    command is sent anyway: the agent decides, with its health of the moment (docs/control.md)."""
    out = []
    for p in presences:
        if p.identity.host not in hosts:
            continue
        selected = set(gpu_indices) or {g.index for g in p.gpus} | {g.index for g in p.gpu_health}
        failed = [g for g in p.gpu_health if g.index in selected and g.health == common_pb2.GPU_HEALTH_FAILED]
        degraded = [g for g in p.gpu_health if g.index in selected and g.health == common_pb2.GPU_HEALTH_DEGRADED]
        for g in failed:
            out.append(f"{p.identity.host}: GPU {g.index} is failed" + (f": {g.reason}" if g.reason else ""))
        for g in degraded:
            out.append(f"{p.identity.host}: GPU {g.index} is degraded" + (f": {g.reason}" if g.reason else ""))
        if failed and len(failed) == len(selected):
            out.append(f"{p.identity.host}: no selected GPU is usable; the agent will refuse the probe")
        elif failed:
            out.append(f"{p.identity.host}: the probe runs on its other GPUs only")
    return out


async def send_command(
    session: Session,
    command: control_pb2.Command,
    key: Ed25519PrivateKey,
    expect: set[str],
    wait_s: float,
    on_reply: Callable[[control_pb2.CommandReply], None] | None = None,
) -> list[control_pb2.CommandReply]:
    """Sign and publish ``command``; collect replies until every host in ``expect`` has answered (or
    ``wait_s`` passed; with an empty ``expect``, always ``wait_s``)."""
    signed = signing.sign(command, key)
    await session.subscribe(topics.replies(command.command_id))
    lifetime_s = (command.expires_at_unix_ns - command.issued_at_unix_ns) / 1e9
    await session.publish(topics.COMMANDS, signed.SerializeToString(), "SignedCommand", expiry_s=int(lifetime_s))
    return await collect_replies(session, command.command_id, expect, wait_s, on_reply)


async def collect_replies(
    session: Session,
    command_id: str,
    expect: set[str],
    wait_s: float,
    on_reply: Callable[[control_pb2.CommandReply], None] | None = None,
) -> list[control_pb2.CommandReply]:
    replies: dict[str, control_pb2.CommandReply] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if expect and expect <= set(replies):
            break
        got = await session.next(deadline - time.monotonic())
        if got is None:
            break
        parts = topics.split(got.topic)
        if len(parts) != 3 or parts[0] != "replies" or parts[1] != command_id:
            continue
        reply = parse(control_pb2.CommandReply, got.payload)
        if reply is not None and reply.host not in replies:
            replies[reply.host] = reply
            if on_reply is not None:
                on_reply(reply)
    return sorted(replies.values(), key=lambda r: r.host)


@dataclass
class ProbeView:
    """What the broker holds about probes: latest progress and results, by (probe, host)."""

    progress: dict[tuple[str, str], control_pb2.ProbeProgress] = field(default_factory=dict)
    results: dict[tuple[str, str], control_pb2.ProbeResult] = field(default_factory=dict)

    def add(self, msg: Received) -> bool:
        parts = topics.split(msg.topic)
        if len(parts) != 3:
            return False
        kind, probe_id, host = parts
        if kind == "progress":
            progress = parse(control_pb2.ProbeProgress, msg.payload)
            if progress is not None:
                self.progress[(probe_id, host)] = progress
                return True
        elif kind == "results":
            result = parse(control_pb2.ProbeResult, msg.payload)
            if result is not None:
                self.results[(probe_id, host)] = result
                return True
        return False

    def probes(self) -> list[str]:
        """Probe ids, most recently started first."""
        started: dict[str, int] = {}
        for (probe_id, _), p in self.progress.items():
            started[probe_id] = max(started.get(probe_id, 0), p.started_unix_ns or p.time_unix_ns)
        for (probe_id, _), r in self.results.items():
            started[probe_id] = max(started.get(probe_id, 0), r.started_unix_ns or r.ended_unix_ns)
        return sorted(started, key=lambda k: -started[k])

    def hosts(self, probe_id: str) -> list[str]:
        return sorted({h for (p, h) in [*self.progress, *self.results] if p == probe_id})

    def done(self, probe_id: str) -> bool:
        hosts = self.hosts(probe_id)
        return bool(hosts) and all((probe_id, h) in self.results for h in hosts)


async def probe_view(session: Session, probe_id: str | None) -> ProbeView:
    view = ProbeView()
    pid = probe_id or "+"
    for msg in await session.snapshot(topics.progress(pid), topics.results(pid)):
        view.add(msg)
    return view
