# The reverse proxy in front of the app replicas: nginx from Debian (WebSockets pass; a replica that fails
# is skipped for 10 s). PROXY_PORT and APP_UPSTREAMS ("host:port host:port") are read at start.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends nginx curl && rm -rf /var/lib/apt/lists/* \
    && rm -f /etc/nginx/sites-enabled/default
COPY docker/nginx.conf.template docker/proxy-entrypoint.sh /etc/nginx/
ENV PROXY_PORT=8780 APP_UPSTREAMS="127.0.0.1:8781 127.0.0.1:8782"
CMD ["sh", "/etc/nginx/proxy-entrypoint.sh"]
