"""Adversarial attacks (step 3): seeded, replayable kernels that the adversarial checks run."""
