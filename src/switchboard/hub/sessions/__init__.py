"""A client connected here: its Peer, its life, its time in transit, and the workspace events it listens to."""
