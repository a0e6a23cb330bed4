"""The hypha-rpc wire protocol without I/O.

Everything here takes bytes or strings and returns values or raises
:class:`switchboard.errors.ProtocolError`; nothing awaits, nothing touches a
socket. The server layer moves bytes, the hub decides with these functions.
"""
