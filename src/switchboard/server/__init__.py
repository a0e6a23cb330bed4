"""The ASGI layer: moves bytes between sockets and the hub, and serves HTTP."""
