"""deploy/prometheus: the scrape job is a valid Prometheus config, the PodMonitor selects the agent's pods."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
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
