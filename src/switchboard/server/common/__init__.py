"""What both doors share: a client's session over WebSocket or HTTP, and how a reset connection is told."""
