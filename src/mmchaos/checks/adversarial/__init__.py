"""Step 3: adversarial attacks on the image side (white-box PGD, black-box queries, transfer)."""
