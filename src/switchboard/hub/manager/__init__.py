"""The workspace manager: the server's own RPC peer, its door, and the methods it answers."""
