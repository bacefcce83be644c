#!/bin/sh
# trust-host-ca.sh: the image trusts what the building host trusts. `codeyard images build` brings the host's CA
# bundle into the context (host-ca-certificates.crt; a site's TLS-inspecting proxy signs PyPI's certificates, and a
# package install or a hash lookup must verify them); a plain build brings none and keeps Debian's.
set -eu
[ ! -f /tmp/ca/host-ca-certificates.crt ] || cp /tmp/ca/host-ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
rm -rf /tmp/ca
