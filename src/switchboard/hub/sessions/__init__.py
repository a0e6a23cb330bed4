"""A client connected here: its Peer, its life, its admission, and the workspace events it listens to."""
