"""Step 5, integration: thread safety, run-to-run determinism, component fingerprints."""
