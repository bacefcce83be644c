#!/bin/sh
# Write nginx.conf from the template with PROXY_PORT and one `server` line per APP_UPSTREAMS entry, then run nginx.
set -eu
servers=""
for upstream in $APP_UPSTREAMS; do servers="$servers    server $upstream max_fails=1 fail_timeout=10s;\n"; done
sed -e "s/@PROXY_PORT@/$PROXY_PORT/" -e "s/@SERVERS@/$servers/" /etc/nginx/nginx.conf.template > /etc/nginx/nginx.conf
exec /usr/sbin/nginx -g "daemon off;"
