"""Pure compaction core: domain types, scoring, splitting, chunking, prompts, clip-archives.

I/O lives only in the adapters that sit beside their ports (``core.model``,
``core.storage``, ``core.embedding``) and in the compactor shell.
"""
