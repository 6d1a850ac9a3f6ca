"""Step 3: adversarial checks (one check a file)."""
