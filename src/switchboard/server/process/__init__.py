"""The serving process: uvicorn, its phase and connections, the stop's deadline, state, start-up checks."""
