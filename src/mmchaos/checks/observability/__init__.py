"""Step 7, observability: drift alarms on perturbed traffic, exported metrics."""
