"""How the training stacks reach the backend, as the conformance suite checks it: FSDP2 (``fully_shard``),
tensor parallelism (``parallelize_module``) and DTensor ``redistribute``, on the group under test.

The stacks make calls the plain-operation properties never make (FSDP2's flat all-gather into a buffer its
input is a view of, its averaged reduce-scatter of gradients, DTensor's placement changes on one and two
mesh dimensions), so each is checked end to end against one process doing the same work: a small model
trained a few steps on the same batch on every rank, or a whole tensor placed and read back. A failure
names the step, the parameter and the collective that first differs.

Each stack is a row of the capability matrix (``fsdp2``, ``tensor_parallel``, ``dtensor_redistribute
<from>-><to>``); ``probe``, run on the live group once per world size in a session with training tests
(conformance/probing.py), says which rows this torch has and marks as N/A a redistribution DTensor refuses
in its own words.
"""
