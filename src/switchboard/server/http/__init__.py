"""The HTTP endpoints: RPC streaming (``/rpc``), service and manager calls, status, the console, errors."""
