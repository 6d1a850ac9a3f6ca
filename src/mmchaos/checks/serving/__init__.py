"""Step 6, serving: faults, poison requests, overload and resilience against a live endpoint."""
