"""How a session gets its ranks: forked here in warm groups (pooled), or this pytest as one rank of a
world torchrun or srun started (spmd)."""
