# PostgreSQL 15 from Debian's package, for the stack and its tests where no registry serves postgres:15.
# Takes the official image's variables: POSTGRES_USER, POSTGRES_DB, POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-15 && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY docker/postgres-entrypoint.sh /usr/local/bin/
USER postgres
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/bin:/usr/bin:/bin PGDATA=/var/lib/postgresql/data
EXPOSE 5432
HEALTHCHECK --interval=5s --timeout=3s --retries=10 CMD ["sh", "-c", "pg_isready -h 127.0.0.1 -U \"${POSTGRES_USER:-postgres}\""]
CMD ["sh", "/usr/local/bin/postgres-entrypoint.sh"]
