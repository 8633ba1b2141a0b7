"""The fleet view: node reports of one topology side by side (the collectives-fleet command)."""
