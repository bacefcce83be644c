# Codeyard app image: the IDE server only (PostgreSQL, Redis and the LLM service run beside it).
# Build: docker build -t codeyard .   Run: see docker-compose.yml.

FROM node:22-slim AS web
WORKDIR /src/web
COPY web/package.json web/package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error
COPY web/ ./
RUN npm run build

FROM python:3.11-slim AS app
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --create-home --uid 10001 --user-group codeyard \
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
# The app image leaves out the heavy [llm] extra; the LLM service gets its own image.
RUN pip install -c constraints.txt . && rm -rf /root/.cache

USER codeyard
ENV CODEYARD_DATA_DIR=/data \
    CODEYARD_HOST=0.0.0.0 \
    CODEYARD_PORT=8000
VOLUME ["/data"]
EXPOSE 8000 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["codeyard", "serve"]
