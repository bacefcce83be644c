# Redis from Debian's package, for the stack and its tests where no registry serves redis:7.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data
USER redis
WORKDIR /data
EXPOSE 6379
HEALTHCHECK --interval=5s --timeout=3s --retries=10 CMD ["redis-cli", "ping"]
CMD ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--appendonly", "yes", "--dir", "/data"]
