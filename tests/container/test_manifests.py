"""deploy/ runs the image the Dockerfile builds, under the name the docs give, on clocks that fit the drain.

Read as text (no YAML parser is a dependency): each pattern names the one line it checks.
"""

from __future__ import annotations

import re

from support.containers import ROOT, VERSION
from switchboard.config import Settings
from switchboard.server.process.stop_deadline import REPORT_WAIT
from switchboard.server.runner import stop_budget

MANIFEST = (ROOT / "deploy" / "switchboard.yaml").read_text()
VALKEY = (ROOT / "deploy" / "valkey.yaml").read_text()
DOCKERFILE = (ROOT / "Dockerfile").read_text()
DEPLOY_DOC = (ROOT / "docs" / "how-to" / "kubernetes.md").read_text()


def one(pattern: str, text: str = MANIFEST) -> str:
    found = re.findall(pattern, text)
    assert len(found) == 1, f"expected one match of {pattern!r}, found {found}"
    return str(found[0])


def test_the_manifest_runs_the_image_the_docs_build():
    image = one(r"\n\s+image: (\S+)")
    assert image == f"switchboard:{VERSION}"
    assert f"build -t {image} ." in DEPLOY_DOC
    assert not re.search(r"\n\s+command:", MANIFEST), (
        "the image's entrypoint (switchboard serve, exec form) must run as PID 1"
    )


def test_the_pods_run_as_the_images_user_and_write_only_its_state_volume():
    user = one(r"\nUSER (\d+):\d+\n", DOCKERFILE)
    state_dir = one(r"SWITCHBOARD_STATE_DIR=(\S+)", DOCKERFILE)
    assert one(r"runAsUser: (\d+)") == user
    assert one(r"fsGroup: (\d+)") == user
    assert one(r"readOnlyRootFilesystem: (\w+)") == "true"
    assert one(r"mountPath: ([^}\s]+)") == state_dir
    assert one(r'VOLUME \["([^"]+)"\]', DOCKERFILE) == state_dir


def test_the_shared_secret_comes_from_a_kubernetes_secret_not_the_manifest():
    assert one(r"- name: SWITCHBOARD_JWT_SECRET.*\n\s+valueFrom: \{secretKeyRef: \{name: (\S+), key: jwt-secret\}\}")
    assert "kind: Secret" not in MANIFEST, "a secret written in the manifest is the same for everyone who applies it"


def test_probes_ask_the_health_endpoints_and_valkey_sits_beside():
    assert one(r"readinessProbe:.*\n\s+httpGet: \{path: (\S+), port: http\}") == "/health/readiness"
    assert one(r"livenessProbe:.*\n\s+httpGet: \{path: (\S+), port: http\}") == "/health/liveness"
    assert "/health/readiness" in one(r"\nHEALTHCHECK .*\n\s+CMD (.*)\n", DOCKERFILE)
    assert one(r"SWITCHBOARD_REDIS_URL\n\s+value: redis://([\w-]+):6379") == one(r"\n  name: (\S+)\nspec", VALKEY)


def test_the_grace_period_outlasts_the_prestop_the_drain_and_the_exit():
    grace = float(one(r"terminationGracePeriodSeconds: (\d+)"))
    pre_stop = float(one(r'preStop:\n(?:\s+#.*\n)*\s+exec: \{command: \["sleep", "(\d+)"\]\}'))
    drain = float(one(r'SWITCHBOARD_DRAIN_TIMEOUT\n\s+value: "(\d+)"'))
    transit = Settings().transit_grace  # the most the drain waits for the clients it sent away
    # the stop's own deadline (server/runner.py) and the report of a stop that hung: a replica
    # says what hung and exits before Kubernetes' SIGKILL (SIGTERM with a client to move measured
    # 0.2-0.55 s to exit 0 in tests/container)
    budget = stop_budget(drain_timeout=drain, transit_grace=transit) + REPORT_WAIT
    assert grace >= pre_stop + budget, (grace, pre_stop, drain, transit)
