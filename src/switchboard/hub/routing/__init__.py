"""Where a frame goes, decided without I/O: the router, its actions and the tables it keeps (every module here is a pure core: tests/test_layers.py)."""
