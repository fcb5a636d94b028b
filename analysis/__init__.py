"""Loaders of result rows and the roofline and phase figures (data only: no torch)."""
