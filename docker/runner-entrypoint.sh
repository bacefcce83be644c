#!/bin/sh
# The runner container's entrypoint: uncovers this container's /proc, then runs the command (codeyard runner).
# bubblewrap mounts a fresh /proc for each run's PID namespace, and the kernel refuses that from a user namespace
# while parts of the container's /proc are covered: Docker masks /proc/kcore, /proc/keys... and mounts /proc/sys
# read-only. `docker run --security-opt systempaths=unconfined` leaves them uncovered, but compose v1 and swarm cannot
# ask for it, so the runner unmounts them itself (it has CAP_SYS_ADMIN, which bubblewrap needs anyway). A run still
# sees only its own /proc, read-only where it matters, as under bubblewrap on a host.
covered=""
for path in $(awk '$5 ~ "^/proc/" {print $5}' /proc/self/mountinfo | sort -r); do
  umount "$path" 2>/dev/null || covered="$covered $path"
done
[ -z "$covered" ] || echo "runner: cannot unmount$covered: runs will fail to mount /proc (give the container CAP_SYS_ADMIN)" >&2
exec "$@"
