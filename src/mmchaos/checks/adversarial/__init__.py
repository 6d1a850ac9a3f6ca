"""Step 3: adversarial checks, one a file (white-box PGD, black-box queries, transfer, text,
typographic, semantic margin)."""
