"""Switchboard: an RPC and event hub, wire-compatible with hypha-rpc clients."""

__version__ = "0.1.0"
