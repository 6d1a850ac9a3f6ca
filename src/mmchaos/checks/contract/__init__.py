"""Step 1, contract: hostile and malformed inputs must get a clear rejection or correct handling."""
