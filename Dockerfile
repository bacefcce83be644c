# Codeyard app image: the IDE server only (PostgreSQL, Redis, the runners and the LLM service run beside it).
# With a registry: docker build -t codeyard/app .   Without one: codeyard images build app
# (BASE is then a Debian made here by debootstrap; wheels come in the context and PIP_NO_INDEX=1).
ARG BASE=python:3.11-slim
ARG WEB_BASE=node:22-slim

FROM ${WEB_BASE} AS web
WORKDIR /src
COPY web/ ./web/
COPY ide_server/ ./ide_server/
# `codeyard images build` brings the assets built; a plain build makes them here.
RUN if [ ! -f ide_server/webassets/.source-hash ]; then \
      cd web && npm ci --no-audit --no-fund --loglevel=error && npm run build; fi

FROM ${BASE} AS app
ARG PIP_NO_INDEX=0
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# git: project history (GitPython); passwd: useradd (a debootstrap minbase has none); ca-certificates: the
# package hash lookups (sandbox.packages.verify) verify PyPI
RUN apt-get update && apt-get install -y --no-install-recommends git passwd ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --user-group codeyard \
    && mkdir /data && chown codeyard:codeyard /data
WORKDIR /opt/codeyard
COPY pyproject.toml constraints.txt README.md ./
COPY ide_server ./ide_server
COPY collab ./collab
COPY sandbox ./sandbox
COPY deploy_service ./deploy_service
COPY tutorials ./tutorials
COPY llm_engine ./llm_engine
COPY --from=web /src/ide_server/webassets ./ide_server/webassets
# wheel[s]: the wheels `codeyard images build` brings (the pattern matches nothing in a plain build)
COPY constraints.txt docker/install-codeyard.sh wheel[s] /tmp/pip/
# The app image leaves out the heavy [llm] extra; the LLM service gets its own image.
RUN sh /tmp/pip/install-codeyard.sh ""
# The bundle the building host trusts, where `codeyard images build` brings it; httpx reads SSL_CERT_FILE (it
# would otherwise verify with certifi's own bundle, which a site's TLS-inspecting proxy is not in)
COPY docker/trust-host-ca.sh host-ca-certificates.cr[t] /tmp/ca/
RUN sh /tmp/ca/trust-host-ca.sh

USER codeyard
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    CODEYARD_DATA_DIR=/data \
    CODEYARD_HOST=0.0.0.0 \
    CODEYARD_PORT=8000
VOLUME ["/data"]
EXPOSE 8000 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["codeyard", "serve"]
