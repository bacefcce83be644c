# A runner node (`codeyard runner`): executes sandbox runs dispatched by the app replicas through Redis.
# Runs use bubblewrap over this image's /usr, so it carries the languages runs use. It needs CAP_SYS_ADMIN (bubblewrap
# makes namespaces, the entrypoint uncovers /proc, the runner makes per-run cgroups) and the shared /data volume.
# With a registry: docker build -f docker/runner.Dockerfile -t codeyard/runner-node .
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG PIP_NO_INDEX=0
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# python3-pip: package installs run `python3 -m pip` in the sandbox, over this image's /usr
RUN apt-get update && apt-get install -y --no-install-recommends \
      bubblewrap python3 python3-pip nodejs gcc g++ libc6-dev bash procps ca-certificates \
    && rm -rf /var/lib/apt/lists/* && mkdir /data && chown 10001:10001 /data  # the app replicas (uid 10001) own the shared volume
WORKDIR /opt/codeyard
COPY pyproject.toml constraints.txt README.md ./
COPY ide_server ./ide_server
COPY collab ./collab
COPY sandbox ./sandbox
COPY deploy_service ./deploy_service
COPY tutorials ./tutorials
COPY llm_engine ./llm_engine
COPY constraints.txt docker/install-codeyard.sh wheel[s] /tmp/pip/
RUN sh /tmp/pip/install-codeyard.sh ""
ENV CODEYARD_DATA_DIR=/data CODEYARD_SANDBOX_BACKEND=bwrap
VOLUME ["/data"]
HEALTHCHECK --interval=5s --timeout=3s --retries=3 CMD ["codeyard", "runner", "--check"]
STOPSIGNAL SIGTERM
COPY docker/runner-entrypoint.sh /usr/local/bin/
# Package installs verify PyPI with the bundle runs see: the building host's where `codeyard images build` brings it
COPY docker/trust-host-ca.sh host-ca-certificates.cr[t] /tmp/ca/
RUN sh /tmp/ca/trust-host-ca.sh
ENTRYPOINT ["sh", "/usr/local/bin/runner-entrypoint.sh"]
CMD ["codeyard", "runner"]
