#!/usr/bin/env python3
"""Init step of the gpuprobe agent's DaemonSet: the node's labels become the agent's identity tags.

The downward API gives a pod its node's name (``spec.nodeName``) but not the node's labels, so this
step reads the pod's own Node object from the Kubernetes API, with the pod's service account (it needs
RBAC ``get`` on ``nodes``, which the chart grants), and writes a gpuprobe configuration file with an
``[agent]`` table that the agent reads through ``GPUPROBE_CONFIG``. Flags and ``GPUPROBE_*`` variables
still win over the file, so a value set in the chart overrides the node's label.

Environment:

- ``NODE_NAME`` (required): the node, from the downward API (``spec.nodeName``);
- ``GPUPROBE_NODE_LABELS``: ``OPTION=LABEL`` pairs, comma-separated, e.g.
  ``region=topology.kubernetes.io/region,instance_type=node.kubernetes.io/instance-type``; OPTION is one
  of the agent's identity options (cluster, cloud, instance_type, region). A label the node lacks
  leaves the option to the agent's own default (DMI for cloud and instance type);
- ``GPUPROBE_IDENTITY_FILE``: where to write the file (default ``/run/gpuprobe/node/identity.toml``);
- ``KUBERNETES_SERVICE_HOST`` / ``KUBERNETES_SERVICE_PORT`` (set by the kubelet), or
  ``GPUPROBE_K8S_API`` (a base URL, which wins; for tests and out-of-cluster use);
- ``GPUPROBE_K8S_TOKEN_DIR``: the service account's token and ``ca.crt``
  (default ``/var/run/secrets/kubernetes.io/serviceaccount``).

Any failure (no RBAC, no API, a bad mapping) exits 1 with one line saying why: the kubelet retries
the init step with backoff, so an agent never starts with tags that differ from its node's labels.
Only the Python standard library is used (the agent's image has nothing else to spare).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

IDENTITY_OPTIONS = ("cluster", "cloud", "instance_type", "region")
DEFAULT_FILE = "/run/gpuprobe/node/identity.toml"
DEFAULT_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class NodeLabelsError(Exception):
    pass


def parse_mapping(text: str) -> dict[str, str]:
    """``OPTION=LABEL,...`` -> {option: label}; an unknown option is an error."""
    mapping: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        option, sep, label = part.strip().partition("=")
        if not sep or not label.strip():
            raise NodeLabelsError(f"GPUPROBE_NODE_LABELS: {part.strip()!r} is not OPTION=LABEL")
        if option.strip() not in IDENTITY_OPTIONS:
            raise NodeLabelsError(
                f"GPUPROBE_NODE_LABELS: {option.strip()!r} is not an identity option ({', '.join(IDENTITY_OPTIONS)})"
            )
        mapping[option.strip()] = label.strip()
    return mapping


def toml_table(values: dict[str, str]) -> str:
    # a JSON string is a valid TOML basic string (the same escapes: \" \\ \n \uXXXX ...)
    lines = ["# written by the gpuprobe agent's node-labels init step: the node's labels", "[agent]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in sorted(values.items())]
    return "\n".join(lines) + "\n"


def read_node_labels(api: str, node: str, token: str | None, context: ssl.SSLContext | None) -> dict[str, str]:
    url = f"{api.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as e:
        hint = " (the service account needs RBAC get on nodes)" if e.code in (401, 403) else ""
        raise NodeLabelsError(f"reading node {node} from {url}: HTTP {e.code} {e.reason}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise NodeLabelsError(f"reading node {node} from {url}: {e}") from None
    labels = body.get("metadata", {}).get("labels", {}) if isinstance(body, dict) else {}
    if not isinstance(labels, dict):
        raise NodeLabelsError(f"node {node}: metadata.labels is not an object")
    return {str(k): str(v) for k, v in labels.items()}


def main(environ: dict[str, str] | None = None) -> int:
    env = dict(os.environ) if environ is None else environ
    try:
        node = env.get("NODE_NAME", "").strip()
        if not node:
            raise NodeLabelsError("NODE_NAME is not set (give it from the downward API: spec.nodeName)")
        mapping = parse_mapping(env.get("GPUPROBE_NODE_LABELS", ""))
        out = Path(env.get("GPUPROBE_IDENTITY_FILE", DEFAULT_FILE))
        found: dict[str, str] = {}
        if mapping:
            token_dir = Path(env.get("GPUPROBE_K8S_TOKEN_DIR", DEFAULT_TOKEN_DIR))
            api = env.get("GPUPROBE_K8S_API", "")
            context: ssl.SSLContext | None = None
            if not api:
                host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
                if not host:
                    raise NodeLabelsError("neither GPUPROBE_K8S_API nor KUBERNETES_SERVICE_HOST is set")
                api = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
            if api.startswith("https://"):
                ca = token_dir / "ca.crt"
                context = ssl.create_default_context(cafile=str(ca) if ca.exists() else None)
            token_file = token_dir / "token"
            token = token_file.read_text().strip() if token_file.exists() else None
            labels = read_node_labels(api, node, token, context)
            found = {option: labels[label] for option, label in mapping.items() if labels.get(label)}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(toml_table(found))
    except (NodeLabelsError, OSError) as e:
        print(f"gpuprobe node-labels: error: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"gpuprobe node-labels: {node}: {json.dumps(found, sort_keys=True)} -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
