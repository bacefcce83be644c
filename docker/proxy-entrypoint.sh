#!/bin/sh
# Write nginx.conf from the template (PROXY_PORT) and its upstreams from APP_UPSTREAMS ("host:port host:port"), then
# run nginx. `codeyard` balances over every replica (round robin). `codeyard_<n>` prefers the n-th (from 1) and keeps
# the others as backups: a client sending the cookie codeyard_replica=<n> is pinned to that replica, and passed to
# another while it is down (HAProxy's sticky server with `option redispatch`). Without the cookie nothing changes.
# `$codeyard_replica_served` is the number of the replica that answered (the last address nginx tried), empty if
# none did: clients are told the replica's number, never its internal address (so APP_UPSTREAMS are given as
# IP:port, the form $upstream_addr takes).
set -eu
server() { echo "    server $1 max_fails=1 fail_timeout=10s$2;"; }
{
  echo "upstream codeyard {"
  for upstream in $APP_UPSTREAMS; do server "$upstream" ""; done
  echo "    keepalive 64;"
  echo "}"
  echo "map \$cookie_codeyard_replica \$codeyard_upstream {"
  echo "    default codeyard;"
  n=0
  for upstream in $APP_UPSTREAMS; do n=$((n + 1)); echo "    $n codeyard_$n;"; done
  echo "}"
  echo "map \$upstream_addr \$codeyard_replica_served {"
  echo "    default \"\";"
  n=0
  for upstream in $APP_UPSTREAMS; do
    n=$((n + 1))
    echo "    \"~(^|, )$(printf %s "$upstream" | sed 's/\./\\./g')\$\" $n;"
  done
  echo "}"
  n=0
  for pinned in $APP_UPSTREAMS; do
    n=$((n + 1))
    echo "upstream codeyard_$n {"
    server "$pinned" ""
    m=0
    for upstream in $APP_UPSTREAMS; do m=$((m + 1)); [ "$m" = "$n" ] || server "$upstream" " backup"; done
    echo "    keepalive 64;"
    echo "}"
  done
} > /etc/nginx/codeyard-upstreams.conf
sed -e "s/@PROXY_PORT@/$PROXY_PORT/" /etc/nginx/nginx.conf.template > /etc/nginx/nginx.conf
exec /usr/sbin/nginx -g "daemon off;"
