"""Clients and frames on their way: clients in transit, the drain that sends them away, frames retried."""
