"""Step 4, engine: batch and padding invariance, precision drift, context limits, backend differentials."""
