"""``GET /ws``: the hub's WebSocket protocol under uvicorn, its frames, and the one read path to the hub."""
