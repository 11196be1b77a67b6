# memd as a docker sidecar: watches the agents' shared workspace volume and
# keeps every agents/*/MEMORY.md inside its context window.
#
#   docker build --build-arg MEMD_UID=$(id -u) --build-arg MEMD_GID=$(id -g) -t memd .
#   docker run --init -v agents:/workspace -v memd-state:/var/lib/memd \
#       --env-file memd.env memd
#
# MEMD_UID/MEMD_GID must match the owner (or group) of the agents' files on
# the volume, so memd can archive and re-seed them (see docs/operations.md).

ARG PYTHON_VERSION=3.12

# --- build: install memd and its dependencies into a self-contained venv ----------
FROM python:${PYTHON_VERSION}-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
# Only what the wheel needs (.dockerignore keeps the rest out of the context).
COPY pyproject.toml README.md ./
COPY memd/ memd/
RUN python -m venv /opt/memd \
    && /opt/memd/bin/pip install --no-cache-dir . \
    && find /opt/memd -name "__pycache__" -prune -exec rm -rf {} +

# --- runtime ---------------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim

ARG MEMD_UID=1000
ARG MEMD_GID=1000
# Agents under uids of their own (docs/operations.md): the group they share,
# like systemd's "agents". /workspace gets it, and memd then makes agents/
# sticky and writable by it (1770), so each agent makes its own folder there.
# Empty: memd's own group (memd and its agents share a uid).
ARG AGENTS_GID=

LABEL org.opencontainers.image.title="memd" \
      org.opencontainers.image.description="Memory-compaction daemon for AI agents (docker sidecar)" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed, configurable non-root user: it must be able to write the agents'
# files on the shared volume. --non-unique lets MEMD_GID name an existing group.
RUN groupadd --gid "${MEMD_GID}" --non-unique memd \
    && useradd --uid "${MEMD_UID}" --gid "${MEMD_GID}" --non-unique \
        --home-dir /var/lib/memd --no-create-home --shell /usr/sbin/nologin memd \
    && mkdir -p /workspace /var/lib/memd /etc/memd \
    && chown "${MEMD_UID}:${MEMD_GID}" /var/lib/memd \
    && chown "${MEMD_UID}:${AGENTS_GID:-${MEMD_GID}}" /workspace \
    && chmod 0700 /var/lib/memd

COPY --from=build /opt/memd /opt/memd
# All defaults, with each key's env var documented; mount your own over it.
COPY config/memd.toml /etc/memd/memd.toml

# LITELLM_LOCAL_MODEL_COST_MAP: litellm must not fetch its price map at import.
# WORKSPACE_DIR is the variable Swarms agents use: same value on both sides.
ENV PATH=/opt/memd/bin:$PATH \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    WORKSPACE_DIR=/workspace \
    MEMD_STATE_DIR=/var/lib/memd \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

USER ${MEMD_UID}:${MEMD_GID}
WORKDIR /var/lib/memd

# Fail the build unless the tiktoken encodings load with no network at all:
# they ship inside litellm's wheel, and nothing may be downloaded at run time.
# Sockets cannot connect in this check (any download attempt fails the build);
# plain RUN, not BuildKit's `RUN --network=none`, so buildah and offline
# builders without a BuildKit frontend image build it too.
RUN python -c "import socket; socket.socket.connect = None; from memd.tokenizer import load_encoding; load_encoding('cl100k_base')"

VOLUME ["/workspace", "/var/lib/memd"]

# `memd health` exits 0 only while the running daemon's heartbeat in the state
# DB is fresh and healthy (not merely while the process exists).
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["memd", "health"]

# memd installs its own SIGTERM/SIGINT handlers, so it shuts down cleanly even
# as PID 1 (an in-flight compaction commits or aborts, never half-way); run
# with --init (compose: init: true) so the cold-scan worker processes are reaped.
STOPSIGNAL SIGTERM
ENTRYPOINT ["memd"]
CMD ["run"]
