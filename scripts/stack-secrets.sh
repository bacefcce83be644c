#!/usr/bin/env bash
# Writes secrets/ for docker-compose.yml once: a random PostgreSQL password, the database URL the replicas
# use with it, and the LLM server's key. Files are 0600; secrets/ is git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p secrets && chmod 700 secrets
[ -f secrets/postgres_password ] && { echo "secrets/ exists; delete it to make new ones"; exit 0; }
umask 077  # the folder; the files are 0644 so non-root services can read them where compose bind-mounts them
password=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')
printf '%s' "$password" > secrets/postgres_password
printf 'postgresql+psycopg://codeyard:%s@%s:%s/codeyard' "$password" "${POSTGRES_HOST:-127.0.0.1}" "${POSTGRES_PORT:-55790}" \
  > secrets/codeyard_database_url
python3 -c 'import secrets; print(secrets.token_urlsafe(32), end="")' > secrets/codeyard_llm_api_key
chmod 644 secrets/*
echo "wrote secrets/postgres_password, secrets/codeyard_database_url, secrets/codeyard_llm_api_key"
