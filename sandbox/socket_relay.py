"""Source text of the byte pumps that helper scripts run inside a sandbox in front of their own code:
the package installs' forwarder to the index proxy, a deployed app's socket bridge and a run's Webview
bridge. They are run with `python3 -c`, which takes one string, so what they share is source text."""

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

# serve_unix(path, port_of): listen on the unix socket `path` (which only the server opens) and join
# each accepted connection to 127.0.0.1:port_of() in the sandbox's own network namespace.
UNIX_TO_TCP = PIPE + r"""
import threading
def join(client, port):
    try:
        upstream = socket.create_connection(("127.0.0.1", port))
    except (OSError, TypeError):
        client.close(); return
    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
    pipe(client, upstream)
    client.close(); upstream.close()
def serve_unix(path, port_of):
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(256)
    def accept():
        while True:
            client, _ = listener.accept()
            threading.Thread(target=join, args=(client, port_of()), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
"""
