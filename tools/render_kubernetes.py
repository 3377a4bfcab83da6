"""Renders the Helm chart (deploy/helm/gpuprobe) into the plain manifests of deploy/kubernetes/.

The manifests in deploy/kubernetes/ are the chart rendered with its default values, release
``gpuprobe`` in namespace ``gpuprobe``, one file per template (plus ``namespace.yaml``, kept by hand),
so that ``kubectl apply -f deploy/kubernetes/`` and ``helm install`` give the same objects. The
rendering is Helm's own template engine (the Helm Go SDK through the ``helm-python-sdk`` wheel, the
``dev`` extra): ``python tools/render_kubernetes.py`` writes the files, ``--check`` fails when they
are stale (tests/deploy/ runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "gpuprobe"
OUT = ROOT / "deploy" / "kubernetes"
RELEASE = "gpuprobe"
NAMESPACE = "gpuprobe"
HEADER = (
    "# Rendered from deploy/helm/gpuprobe/{template} with the chart's default values (release {release},\n"
    "# namespace {namespace}) by tools/render_kubernetes.py; do not edit: change the chart and render again.\n"
)


def render(values: dict[str, object] | None = None) -> dict[str, str]:
    """{file name in deploy/kubernetes/: text} of the chart rendered with ``values`` (None: the defaults)."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    out: dict[str, str] = {}
    for path, text in sorted(manifests.items()):
        name = Path(path).name
        if not name.endswith(".yaml") or not text.strip():
            continue  # helpers, and templates that render nothing with these values
        template = path.split("/", 1)[1]
        out[name] = HEADER.format(template=template, release=RELEASE, namespace=NAMESPACE) + text.lstrip("\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail when deploy/kubernetes/ differs from the chart")
    args = parser.parse_args()
    rendered = render()
    stale = sorted(
        name for name, text in rendered.items() if not (OUT / name).exists() or (OUT / name).read_text() != text
    )
    if args.check:
        if stale:
            print(f"deploy/kubernetes/ is stale ({', '.join(stale)}): run python tools/render_kubernetes.py")
            return 1
        return 0
    for name in stale:
        (OUT / name).write_text(rendered[name])
        print(f"wrote deploy/kubernetes/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
