"""deploy/prometheus: the scrape job is a valid Prometheus config, the PodMonitor selects the agent's pods."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml
from k8s_helpers import ROOT, container, find, objects

sys.path.insert(0, str(ROOT / "tools"))
import render_kubernetes

HERE = ROOT / "deploy" / "prometheus"


def test_the_scrape_job_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool (Debian's prometheus package) is missing: make deps installs it")
    result = subprocess.run(
        [promtool, "check", "config", str(HERE / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = yaml.safe_load((HERE / "prometheus.yml").read_text())["scrape_configs"]
    assert all(t.endswith(":9400") for job in jobs for c in job["static_configs"] for t in c["targets"])


def test_the_pod_monitor_selects_the_agent_daemonsets_pods() -> None:
    monitor = yaml.safe_load((HERE / "podmonitor.yaml").read_text())
    daemonset = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "agent-daemonset.yaml").read_text())
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert monitor["kind"] == "PodMonitor"
    assert monitor["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True


def test_the_chart_serves_the_gpu_metrics_on_the_port_the_pod_monitor_scrapes() -> None:
    monitor = yaml.safe_load((HERE / "podmonitor.yaml").read_text())
    agent = container(find(objects(render_kubernetes.render()), "DaemonSet")["spec"]["template"]["spec"], "agent")
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "gpu-metrics"
    assert agent["args"][agent["args"].index("--prometheus-listen") + 1] == f"0.0.0.0:{ports['gpu-metrics']}"
    assert ports["gpu-metrics"] == 9400, "dcgm-exporter's port"
    off = render_kubernetes.render({"agent": {"gpuMetricsPort": 0}})
    agent = container(find(objects(off), "DaemonSet")["spec"]["template"]["spec"], "agent")
    assert "--prometheus-listen" not in agent["args"] and "gpu-metrics" not in {p["name"] for p in agent["ports"]}
