"""deploy/kubernetes/ and the Helm chart: Kubernetes' schemas, Helm's engine, and the agent's and the
collector's own option parsers decide, not the eye (docs/kubernetes.md, "What was validated").

- every manifest validates strictly (no unknown field) against the pinned Kubernetes versions'
  schemas that kubernetes-validate ships, offline;
- the manifests are the chart rendered by Helm's Go SDK with its default values, byte for byte;
- the agent's and the collector's args and environment are parsed by gpuprobe's own parsers and
  checked by its own settings checks (the agent's `--check`, the collector's `CollectorSettings.check`);
- the objects agree: what the agent needs is mounted, the collector acknowledges after the sink, the
  agents dial the collector Service, ports and images are the same everywhere.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from k8s_helpers import (
    CHART,
    K8S_VERSIONS,
    MANIFESTS,
    ROOT,
    container,
    container_env,
    expand,
    find,
    manifest_files,
    objects,
    remap,
)

sys.path.insert(0, str(ROOT / "tools"))
import render_kubernetes

sys.path.insert(0, str(CHART / "files"))
import node_labels

NODE = "gpu-node-1"
NODE_LABELS = {
    "topology.kubernetes.io/region": "eu-west-1",
    "node.kubernetes.io/instance-type": "p5.48xlarge",
    "nvidia.com/gpu.present": "true",
}


def test_the_manifests_are_there() -> None:
    kinds = sorted(d["kind"] for d in objects())
    assert kinds == sorted(
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "StatefulSet",
            "Service",
            "Service",
        ]
    )


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_every_manifest_validates_against_the_kubernetes_schema(path: Path, version: str) -> None:
    docs = yaml.safe_load_all(path.read_text())
    for doc in filter(None, docs):
        assert kubernetes_validate.validate(doc, version, strict=True) == version


def test_the_validation_is_strict_enough_to_catch_a_typo() -> None:
    daemonset = copy.deepcopy(find(objects(), "DaemonSet"))
    kubernetes_validate.validate(daemonset, K8S_VERSIONS[0], strict=True)
    daemonset["spec"]["template"]["spec"]["hostPid"] = False  # hostPID, misspelt
    with pytest.raises(kubernetes_validate.ValidationError, match="hostPid"):
        kubernetes_validate.validate(daemonset, K8S_VERSIONS[0], strict=True)
    statefulset = copy.deepcopy(find(objects(), "StatefulSet"))
    statefulset["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, K8S_VERSIONS[0], strict=True)


def test_the_manifests_are_the_chart_rendered_with_its_defaults() -> None:
    rendered = render_kubernetes.render()
    on_disk = {p.name: p.read_text() for p in manifest_files() if p.name != "namespace.yaml"}
    assert sorted(rendered) == sorted(on_disk), "run python tools/render_kubernetes.py"
    for name, text in rendered.items():
        assert on_disk[name] == text, f"deploy/kubernetes/{name} is stale: run python tools/render_kubernetes.py"


def test_the_chart_lints_clean() -> None:
    import helm_python as helm

    report = helm.lint(str(CHART))
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] > 1] == [], report  # 1 is INFO


def test_the_chart_with_every_option_on_renders_valid_objects() -> None:
    values: dict[str, Any] = {
        "secrets": {
            "create": True,
            "tlsCrt": "-----BEGIN CERTIFICATE-----\n",
            "tlsKey": "-----BEGIN PRIVATE KEY-----\n",
            "caCrt": "-----BEGIN CERTIFICATE-----\n",
            "collectorTokens": f"{NODE} 0123456789abcdef0123\n",
            "agentTokens": {NODE: "0123456789abcdef0123"},
            "influxPassword": "secret",
        },
        "agent": {"runtimeClassName": "", "cluster": "lab", "extraCollectors": ["collector.other.example:7447"]},
        "collector": {"influx": {"createDb": True}, "wal": {"storageClassName": "fast"}},
    }
    docs = objects(render_kubernetes.render(values))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"} == {
        "gpuprobe-collector-tls",
        "gpuprobe-collector-tokens",
        "gpuprobe-agent-tokens",
        "gpuprobe-influx",
    }
    pod = find(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in pod
    args = container(pod, "agent")["args"]
    assert args[args.index("--collector") + 1] == "gpuprobe-collector.gpuprobe.svc:7447,collector.other.example:7447"
    assert {"name": "GPUPROBE_CLUSTER", "value": "lab"} in container(pod, "agent")["env"]
    collector_args = container(find(docs, "StatefulSet")["spec"]["template"]["spec"], "collector")["args"]
    assert "--influx-create-db" in collector_args


def test_the_agents_can_dial_each_collector_replica_by_name() -> None:
    """agent.dialReplicas: one address per StatefulSet pod, under the headless Service, in pod order."""
    docs = objects(render_kubernetes.render({"agent": {"dialReplicas": True}, "collector": {"replicas": 3}}))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
    statefulset = find(docs, "StatefulSet")
    headless = find(docs, "Service", "-headless")
    assert statefulset["spec"]["replicas"] == 3 and statefulset["spec"]["serviceName"] == headless["metadata"]["name"]
    port = headless["spec"]["ports"][0]["port"]
    expected = [
        f"{statefulset['metadata']['name']}-{i}.{headless['metadata']['name']}.gpuprobe.svc:{port}" for i in range(3)
    ]
    args = container(find(docs, "DaemonSet")["spec"]["template"]["spec"], "agent")["args"]
    assert args[args.index("--collector") + 1].split(",") == expected
    from gpuprobe.agent.settings import split_addresses

    assert split_addresses([args[args.index("--collector") + 1]]) == expected


def _values_leaves(tree: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """The paths of values.yaml down to its scalars, lists and empty maps (a key may hold dots)."""
    if isinstance(tree, dict) and tree:
        return {leaf for key, value in tree.items() for leaf in _values_leaves(value, (*prefix, key))}
    return {prefix}


def test_every_value_a_template_reads_is_in_values_yaml_and_every_value_is_read() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    leaves = _values_leaves(values)
    used: set[tuple[str, ...]] = set()
    for template in (CHART / "templates").iterdir():
        used |= {tuple(p.split(".")) for p in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text())}
    assert used, "no template reads a value?"
    undefined = {".".join(u) for u in used if not any(leaf[: len(u)] == u for leaf in leaves)}
    assert undefined == set(), "templates read values that values.yaml does not define"
    unread = {".".join(leaf) for leaf in leaves if not any(leaf[: len(u)] == u for u in used)}
    assert unread == set(), "values.yaml defines values no template reads"


# --- what the agent needs ---------------------------------------------------------------------------


def _agent_pod() -> dict[str, Any]:
    pod: dict[str, Any] = find(objects(), "DaemonSet")["spec"]["template"]["spec"]
    return pod


def _mounts(c: dict[str, Any], pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    volumes = {v["name"]: v for v in pod["volumes"]}
    out = {}
    for m in c.get("volumeMounts", []):
        assert m["name"] in volumes, f"{c['name']} mounts {m['name']}, which is no volume"
        out[m["mountPath"]] = volumes[m["name"]]
    return out


def _arg(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def test_the_daemonset_gives_the_agent_nvml_without_taking_gpus_or_host_pids() -> None:
    pod = _agent_pod()
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["hostPID"] is False  # no per-process attribution in the agent
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    agent = container(pod, "agent")
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")  # NVML
    for c in pod["containers"] + pod["initContainers"]:
        requested = {**c.get("resources", {}).get("requests", {}), **c.get("resources", {}).get("limits", {})}
        assert not any(k.startswith("nvidia.com/") for k in requested), "the device plugin would hand GPUs to the agent"
        assert c.get("securityContext", {}).get("privileged") is not True
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_the_daemonset_mounts_what_the_agent_reads_and_writes() -> None:
    pod = _agent_pod()
    agent = container(pod, "agent")
    mounts = _mounts(agent, pod)
    args = agent["args"]
    # the spool on the node, so that it outlives the pod, and writable
    spool = _arg(args, "--spool")
    spool_mount = next(m for m in mounts if spool.startswith(m + "/"))
    assert mounts[spool_mount]["hostPath"]["type"] == "DirectoryOrCreate"
    assert not any(m["mountPath"] == spool_mount and m.get("readOnly") for m in agent["volumeMounts"])
    owner = container(pod, "spool-owner", init=True)
    assert owner["command"][-1] == spool_mount and spool_mount in _mounts(owner, pod)
    assert owner["command"][1] == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    # the collector's CA, the per-node token, the identity file: each under a mount of the right volume
    ca = _arg(args, "--tls-ca")
    assert mounts[str(Path(ca).parent)]["secret"]["items"] == [{"key": Path(ca).name, "path": Path(ca).name}]
    token = _arg(args, "--token-file")
    assert token.endswith("/$(NODE_NAME)") and "secret" in mounts[str(Path(token).parent)]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert list(env).index("NODE_NAME") < list(env).index("GPUPROBE_HOST")  # $(NODE_NAME) is defined before
    assert env["GPUPROBE_HOST"]["value"] == "$(NODE_NAME)"
    identity = env["GPUPROBE_CONFIG"]["value"]
    labels_step = container(pod, "node-labels", init=True)
    step_env = {e["name"]: e for e in labels_step["env"]}
    assert step_env["GPUPROBE_IDENTITY_FILE"]["value"] == identity
    identity_dir = str(Path(identity).parent)
    assert mounts[identity_dir] is _mounts(labels_step, pod)[identity_dir]
    assert "emptyDir" in mounts[identity_dir]
    # the API token goes to the init step only
    assert pod["automountServiceAccountToken"] is False
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in _mounts(labels_step, pod)
    assert not any("serviceAccountToken" in json.dumps(v) for v in mounts.values())
    # the init step runs the script the ConfigMap holds, which is files/node_labels.py
    script_dir = str(Path(labels_step["command"][-1]).parent)
    configmap = find(objects(), "ConfigMap", "-agent-node-labels")
    assert _mounts(labels_step, pod)[script_dir]["configMap"]["name"] == configmap["metadata"]["name"]
    assert configmap["data"]["node_labels.py"] + "\n" == (CHART / "files" / "node_labels.py").read_text()
    # stop: --grace, then 20 s for the rest, as the systemd unit
    grace = _arg(args, "--grace")
    assert pod["terminationGracePeriodSeconds"] == int(grace.rstrip("s")) + 20


def test_the_node_reader_role_allows_only_get_on_nodes() -> None:
    docs = objects()
    role = find(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    binding = find(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = find(docs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "gpuprobe"}
    ]
    assert find(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


# --- the node-labels init step, run for real against a stand-in API server ---------------------------


class _FakeApi(BaseHTTPRequestHandler):
    token = "sa-token"

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_error(403, "forbidden")
            return
        if self.path != f"/api/v1/nodes/{NODE}":
            self.send_error(404, "not found")
            return
        body = json.dumps({"kind": "Node", "metadata": {"name": NODE, "labels": NODE_LABELS}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def fake_api() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _run_node_labels_step(tmp_path: Path, api: str, token: str = "sa-token") -> tuple[int, Path]:
    pod = _agent_pod()
    step = container(pod, "node-labels", init=True)
    env = container_env(step, NODE, "gpuprobe-agent-x", {})
    token_dir = tmp_path / "sa"
    token_dir.mkdir(exist_ok=True)
    (token_dir / "token").write_text(token + "\n")
    mounts = {m: tmp_path / "mnt" / m.strip("/").replace("/", "_") for m in _mounts(step, pod)}
    env["GPUPROBE_IDENTITY_FILE"] = remap(env["GPUPROBE_IDENTITY_FILE"], mounts)
    env.update(GPUPROBE_K8S_API=api, GPUPROBE_K8S_TOKEN_DIR=str(token_dir))
    return node_labels.main(env), Path(env["GPUPROBE_IDENTITY_FILE"])


def test_the_init_step_turns_the_node_labels_into_identity_options(tmp_path: Path, fake_api: str) -> None:
    rc, identity = _run_node_labels_step(tmp_path, fake_api)
    assert rc == 0
    import tomllib

    assert tomllib.loads(identity.read_text()) == {"agent": {"region": "eu-west-1", "instance_type": "p5.48xlarge"}}


def test_the_init_step_fails_without_rbac(tmp_path: Path, fake_api: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, identity = _run_node_labels_step(tmp_path, fake_api, token="wrong")
    assert rc == 1 and not identity.exists()
    err = capsys.readouterr().err
    assert "HTTP 403" in err and "RBAC get on nodes" in err


def test_the_init_step_refuses_an_option_that_is_no_identity_option() -> None:
    with pytest.raises(node_labels.NodeLabelsError, match="not an identity option"):
        node_labels.parse_mapping("host=kubernetes.io/hostname")
    assert node_labels.toml_table({"region": 'a"b\\c'}).endswith('region = "a\\"b\\\\c"\n')


def test_the_agent_takes_the_daemonsets_args_and_environment(tmp_path: Path, fake_api: str) -> None:
    """The agent's own `--check` reads the container's args, environment and files (remapped)."""
    rc, identity = _run_node_labels_step(tmp_path, fake_api)
    assert rc == 0
    pod = _agent_pod()
    agent = container(pod, "agent")
    env = container_env(agent, NODE, "gpuprobe-agent-x", {})
    mounts = {m: tmp_path / "mnt" / m.strip("/").replace("/", "_") for m in _mounts(agent, pod)}
    for folder in mounts.values():
        folder.mkdir(parents=True, exist_ok=True)
    args = [remap(expand(a, env), mounts) for a in agent["args"]]
    Path(_arg(args, "--token-file")).write_text("0123456789abcdef0123\n")
    Path(_arg(args, "--tls-ca")).write_text("-----BEGIN CERTIFICATE-----\n")
    env = {k: remap(v, mounts) for k, v in env.items()}
    assert Path(env["GPUPROBE_CONFIG"]) == identity
    out = subprocess.run(
        [sys.executable, "-m", "gpuprobe.app", *args, "--check"],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "gpuprobe-collector.gpuprobe.svc:7447" in out.stdout
    for value in (NODE, "eu-west-1", "p5.48xlarge"):
        assert value in out.stdout, f"{value} not in the effective settings:\n{out.stdout}"


# --- the collector ------------------------------------------------------------------------------------


def _collector_pod() -> dict[str, Any]:
    pod: dict[str, Any] = find(objects(), "StatefulSet")["spec"]["template"]["spec"]
    return pod


def test_the_collector_acks_after_the_sink_and_drains_on_sigterm() -> None:
    statefulset = find(objects(), "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    args = container(pod, "collector")["args"]
    assert _arg(args, "--ack-after") == "sink"
    # the kubelet's SIGKILL comes after the collector's own drain deadline, with a margin
    drain = _arg(args, "--drain-timeout")
    assert drain.endswith("s") and pod["terminationGracePeriodSeconds"] >= int(drain[:-1]) + 15
    # the WAL on the replica's own volume
    wal = _arg(args, "--wal")
    claims = {c["metadata"]["name"]: c for c in statefulset["spec"]["volumeClaimTemplates"]}
    mount = next(m for m in container(pod, "collector")["volumeMounts"] if m["mountPath"] == wal)
    assert mount["name"] in claims and not mount.get("readOnly")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]


def test_the_agents_dial_the_collector_service_on_the_collectors_port() -> None:
    docs = objects()
    service = find(docs, "Service", "-collector")
    statefulset = find(docs, "StatefulSet")
    collector = container(statefulset["spec"]["template"]["spec"], "collector")
    ports = {p["name"]: p["containerPort"] for p in collector["ports"]}
    assert _arg(collector["args"], "--listen") == f"0.0.0.0:{ports['grpc']}"
    assert _arg(collector["args"], "--metrics-listen") == f"0.0.0.0:{ports['metrics']}"
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert service_ports["grpc"]["port"] == ports["grpc"] and service_ports["grpc"]["targetPort"] == "grpc"
    assert service["spec"]["selector"] == statefulset["spec"]["selector"]["matchLabels"]
    headless = find(docs, "Service", "-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert statefulset["spec"]["serviceName"] == headless["metadata"]["name"]
    address = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{ports['grpc']}"
    agent_args = container(_agent_pod(), "agent")["args"]
    assert _arg(agent_args, "--collector").split(",")[0] == address


def test_the_collector_takes_the_statefulsets_args_and_environment(tmp_path: Path) -> None:
    """The collector's own parser and settings check read the container's args and environment."""
    from gpuprobe.app.cli import all_commands, build_parser
    from gpuprobe.collector.cli import config_from_options
    from gpuprobe.config import resolve

    pod = _collector_pod()
    collector = container(pod, "collector")
    env = container_env(collector, "node-a", "gpuprobe-collector-0", {"gpuprobe-influx/password": "pw"})
    mounts = {m["mountPath"]: tmp_path / m["name"] for m in collector["volumeMounts"]}  # the WAL's is a claim
    args = [remap(expand(a, env), mounts) for a in collector["args"]]
    commands = all_commands()
    command = next(c for c in commands if c.name == "collector")
    parsed = build_parser(commands).parse_args(args)
    values = resolve("collector", command.options, parsed, environ=env)
    settings = config_from_options(values)
    assert settings.collector_id == "gpuprobe-collector-0"
    assert settings.influx.password == "pw"
    assert settings.tls and settings.tokens_file is not None and not settings.insecure
    assert str(settings.wal_dir) == str(tmp_path / "wal")
    assert values["ack_after"] == "sink"
    assert values["drain_timeout"] == 90.0


def test_the_images_are_the_ones_the_containerfiles_build() -> None:
    docs = objects()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    images = {
        "agent": container(_agent_pod(), "agent")["image"],
        "collector": container(find(docs, "StatefulSet")["spec"]["template"]["spec"], "collector")["image"],
    }
    for role, image in images.items():
        assert image == f"{values['image'][role]['repository']}:{values['image'][role]['tag']}"
        containerfile = (ROOT / "deploy" / "containers" / f"{role}.Containerfile").read_text()
        assert f"-t {image} ." in containerfile, f"{role}.Containerfile builds another tag than {image}"
    for c in _agent_pod()["initContainers"]:
        assert c["image"] == images["agent"]
    assert MANIFESTS.is_dir()
