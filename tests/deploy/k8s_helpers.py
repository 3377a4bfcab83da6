"""What the tests of deploy/ share: the manifests, the chart, and Kubernetes' own rules for them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
CHART = ROOT / "deploy" / "helm" / "gpuprobe"
CONTAINERS = ROOT / "deploy" / "containers"

# The oldest Kubernetes the chart claims (Chart.yaml kubeVersion) and the newest whose schemas
# kubernetes-validate 1.37.0 ships: every manifest must validate against both, offline.
K8S_VERSIONS = ("1.30", "1.37")


def load_documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def manifest_files() -> list[Path]:
    return sorted(MANIFESTS.glob("*.yaml"))


def objects(files: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every object of deploy/kubernetes/ (or of rendered ``{name: text}``)."""
    texts = files.values() if files is not None else [p.read_text() for p in manifest_files()]
    return [doc for text in texts for doc in load_documents(text)]


def find(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} named *{name_suffix}, found {[d['metadata']['name'] for d in found]}"
    obj: dict[str, Any] = found[0]
    return obj


def container(pod_spec: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    key = "initContainers" if init else "containers"
    found = [c for c in pod_spec.get(key, []) if c["name"] == name]
    assert len(found) == 1, f"no {key[:-1]} {name!r}"
    c: dict[str, Any] = found[0]
    return c


_VAR = re.compile(r"\$\((\w+)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args and env values (an unknown name stays as written)."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def container_env(c: dict[str, Any], node_name: str, pod_name: str, secrets: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet would set it (downward API and Secrets resolved)."""
    env: dict[str, str] = {}
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(item["value"], env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            env[item["name"]] = {"spec.nodeName": node_name, "metadata.name": pod_name}[path]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            key = f"{ref['name']}/{ref['key']}"
            if key in secrets:
                env[item["name"]] = secrets[key]
            else:
                assert ref.get("optional"), f"secret {key} is neither given nor optional"
        else:
            raise AssertionError(f"unexpected env source {source}")
    return env


def remap(text: str, mounts: dict[str, Path]) -> str:
    """A path inside the container -> the same file under the test's folders (longest mount first)."""
    for mount in sorted(mounts, key=len, reverse=True):
        if text == mount or text.startswith(mount + "/"):
            return str(mounts[mount]) + text[len(mount) :]
    return text
