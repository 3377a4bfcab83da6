"""Part: control. Which agents a probe runs on: the ``--nodes`` syntax and ``NodeSelector`` matching.

``--nodes`` is a comma-separated list of terms:

- ``all``: every agent;
- ``KEY=VALUE`` with KEY one of ``host``, ``cluster``, ``cloud``, ``instance_type``, ``region``;
- a bare ``VALUE``: a host name (``gpu-a,gpu-b`` is ``host=gpu-a,host=gpu-b``).

Values of the same key are alternatives (OR); different keys must all match (AND):
``cluster=train,region=us-east-1,region=us-west-2`` is every agent of cluster ``train`` in either
region. An empty selector matches nobody, so a fleet-wide probe is always explicit (``all``).
"""

from __future__ import annotations

from gpuprobe.v1 import common_pb2, control_pb2

KEYS = {
    "host": "hosts",
    "cluster": "clusters",
    "cloud": "clouds",
    "instance_type": "instance_types",
    "instance-type": "instance_types",
    "region": "regions",
}


def parse(text: str) -> control_pb2.NodeSelector:
    selector = control_pb2.NodeSelector()
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            continue
        if term == "all":
            selector.all_agents = True
            continue
        key, eq, value = term.partition("=")
        if not eq:
            key, value = "host", term
        field = KEYS.get(key.strip())
        if field is None:
            raise ValueError(f"--nodes: unknown key {key!r} (host, cluster, cloud, instance_type, region or all)")
        if not value.strip():
            raise ValueError(f"--nodes: {term!r} has no value")
        getattr(selector, field).append(value.strip())
    if not selector.all_agents and not any(getattr(selector, f) for f in set(KEYS.values())):
        raise ValueError("--nodes selects nobody: give 'all', host names or KEY=VALUE terms")
    return selector


def describe(selector: control_pb2.NodeSelector) -> str:
    parts = ["all"] if selector.all_agents else []
    for key, field in (
        ("host", "hosts"),
        ("cluster", "clusters"),
        ("cloud", "clouds"),
        ("instance_type", "instance_types"),
        ("region", "regions"),
    ):
        parts += [f"{key}={v}" for v in getattr(selector, field)]
    return ",".join(parts) or "(nobody)"


def match(selector: control_pb2.NodeSelector, identity: common_pb2.AgentIdentity) -> tuple[bool, bool]:
    """(selected, named): ``named`` when the selector lists this host (so a refusal is owed even when
    another criterion excludes it)."""
    named = identity.host in selector.hosts
    lists = {
        "hosts": identity.host,
        "clusters": identity.cluster,
        "clouds": identity.cloud,
        "instance_types": identity.instance_type,
        "regions": identity.region,
    }
    any_list = any(len(getattr(selector, f)) for f in lists)
    if not selector.all_agents and not any_list:
        return False, named
    for field, value in lists.items():
        values = getattr(selector, field)
        if values and value not in values:
            return False, named
    return True, named
