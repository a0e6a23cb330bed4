"""Scaffolding only these tests use (what applications may use is in ``switchboard.testing``)."""
