# Switchboard as a container image: `switchboard serve` as PID 1, as a non-root user.
#
#   docker build -t switchboard:0.1.0 .          (or: podman build --format docker ...)
#   docker run --rm -p 9527:9527 -e SWITCHBOARD_JWT_SECRET=... switchboard:0.1.0
#
# BASE is any image with python3 (3.11 or later) and its venv module: by default the
# official slim Python image; the tests build one from Debian packages with mmdebstrap
# (tests/container), where no registry can be reached.
ARG BASE=docker.io/library/python:3.12-slim-bookworm

FROM ${BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/switchboard
# The pinned dependencies and the build backend first, read from pyproject.toml, in a
# layer of their own: a change to the source rebuilds only the small layer below.
COPY pyproject.toml /src/
RUN python3 -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb")); print("\n".join(p["project"]["dependencies"] + p["build-system"]["requires"]))' \
        > /src/requirements.txt \
    && /opt/switchboard/bin/pip install --requirement /src/requirements.txt
COPY README.md /src/
COPY src /src/src
RUN /opt/switchboard/bin/pip install --no-deps --no-build-isolation /src \
    && /opt/switchboard/bin/pip uninstall --yes setuptools wheel \
    && /opt/switchboard/bin/python -m compileall -q /opt/switchboard/lib

FROM ${BASE}
# A fixed numeric id: Kubernetes' runAsNonRoot can check it, and a volume can be given to it.
RUN groupadd --system --gid 10001 switchboard \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/switchboard --shell /usr/sbin/nologin switchboard \
    && mkdir -p /var/lib/switchboard \
    && chown 10001:10001 /var/lib/switchboard
COPY --from=build /opt/switchboard /opt/switchboard
ENV PATH=/opt/switchboard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SWITCHBOARD_HOST=0.0.0.0 \
    SWITCHBOARD_PORT=9527 \
    SWITCHBOARD_STATE_DIR=/var/lib/switchboard
# What the hub keeps across restarts (its generated JWT secret): mount a volume here.
VOLUME ["/var/lib/switchboard"]
WORKDIR /var/lib/switchboard
USER 10001:10001
EXPOSE 9527
# 503 while starting or draining. The port follows SWITCHBOARD_PORT (set the port with
# it, not with --port, or this checks the wrong one). The image has no curl: Python asks.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health/readiness' % os.environ.get('SWITCHBOARD_PORT', '9527'), timeout=2)"]
# Exec form: the hub is PID 1 and receives SIGTERM itself, drains its clients to a
# sibling and exits 0 (in well under 2 s when no call is in flight); a shell in between
# would swallow the signal.
STOPSIGNAL SIGTERM
ENTRYPOINT ["switchboard", "serve"]
