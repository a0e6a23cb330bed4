"""hypha-rpc's wire, as its clients speak it: the frames' envelope, calls and replies, chunked
messages, payload bounds, the handshake, service ids and lookups, the id grammar."""
