"""deploy/ keeps metrics off the public ports: every daemon's systemd unit gives its operator
listener a port of its own, and no Kubernetes Service exposes the pods' "ops" port."""

from __future__ import annotations

import re
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DAEMONS = ("api", "dispatcher", "scheduler", "delivery", "weave")


def test_each_systemd_unit_sets_its_own_operator_port() -> None:
    ports = {}
    for daemon in DAEMONS:
        unit = (DEPLOY / "systemd" / f"orbit-{daemon}.service").read_text()
        found = re.findall(r"^Environment=ORBIT_SERVICE_METRICS_PORT=(\d+)$", unit, re.MULTILINE)
        assert len(found) == 1, daemon
        ports[daemon] = int(found[0])
    assert len(set(ports.values())) == len(DAEMONS), ports
    shared = (DEPLOY / "systemd" / "orbit.env.example").read_text()
    assert not re.search(r"^ORBIT_SERVICE_METRICS_(PORT|HOST)=", shared, re.MULTILINE)


def test_kubernetes_serves_metrics_on_the_ops_port_only() -> None:
    k8s = DEPLOY / "kubernetes"
    for daemon in DAEMONS:
        deployment = (k8s / f"{daemon}-deployment.yaml").read_text()
        assert re.search(r"- name: ops\n\s+containerPort: 9090\n", deployment), daemon
        assert re.search(r"- name: ORBIT_SERVICE_METRICS_PORT\n\s+value: \"9090\"\n",
                         deployment), daemon
        assert 'prometheus.io/port: "9090"' in deployment, daemon
    for service in k8s.glob("*-service.yaml"):
        text = service.read_text()
        assert "ops" not in re.findall(r"targetPort: (\S+)", text), service
        assert "prometheus.io" not in text, service
    assert "network-policy.yaml" in (k8s / "kustomization.yaml").read_text()
