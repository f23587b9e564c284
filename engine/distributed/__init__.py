"""Tensor and pipeline parallelism: one process per rank, torch.distributed between them.

- ``parallel_state``: a rank's groups (tensor-parallel, pipeline stage) and collectives;
  the context models are built in;
- ``sharding``: which slice of a checkpoint tensor a tensor-parallel rank keeps;
- ``row_shards``: the same for row-parallel layers, act-order GPTQ included;
- ``workers``: the processes of ranks 1..N-1 and the messages rank 0 sends them;
- ``channels``: how those messages travel (pipes on one host, the store across hosts);
- ``node``: ``python -m tamis.engine.distributed.node``, the ranks of another host, or
  under torchrun any one rank;
- ``torchrun``: a rank's place in a torchrun launch, read from its environment;
- ``runner``: the model runners of rank 0 (the engine's) and of the other ranks.

See docs/parallelism.md.
"""
