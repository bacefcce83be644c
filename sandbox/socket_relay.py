"""Source text of the byte pump that helper scripts run inside a sandbox put in front of their own
code: the package installs' forwarder to the index proxy and a deployed app's socket bridge.
They are run with `python3 -c`, which takes one string, so what they share is source text."""

PIPE = r"""
import socket
def pipe(a, b):
    try:
        while data := a.recv(262144):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try: s.shutdown(socket.SHUT_RDWR)
            except OSError: pass
"""
