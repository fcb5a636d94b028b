"""What memory a measurement stands on: the host caches, the device's free bytes, and poisoned allocations."""
