"""Tensor parallelism: one process per rank, torch.distributed between them.

- ``parallel_state``: a rank's group and its collectives; the context models are built in;
- ``sharding``: which slice of a checkpoint tensor each rank keeps;
- ``workers``: the processes of ranks 1..N-1 and the messages rank 0 sends them;
- ``runner``: the model runners of rank 0 (the engine's) and of the other ranks.
"""
