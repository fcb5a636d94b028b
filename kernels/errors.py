"""Exceptions shared by every attention implementation."""


class Unsupported(NotImplementedError):
    """A valid request that this implementation (or this machine) cannot serve."""
