"""Test doubles for tidemq; production code never imports this package.

`tidemq.testing.files.FaultFileSystem` is an in-memory `tidemq.store.files.FileSystem` for
deterministic crash simulation: it loses what was not synced, tears writes and injects faults.
`tidemq.testing.netns` makes test hosts in Linux network namespaces on a bridge, and cuts
them off (network partitions); it needs root, and says why not where it cannot.
"""
