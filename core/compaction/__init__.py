"""The compaction: the compactor's pipeline, one job per module.

``factory`` builds the ``PipelineCompactor`` (``compactor``), which runs each
compaction as one ``attempt`` under the conversation's circuit breaker: an
ordinary one through the ``pipeline`` (split → chunk → summarise →
re-summarise → fit → plan), an operator's through ``redo`` (recompact,
restore); ``fitting`` keeps the clip-archive under the target, ``batches``
tracks the live batches a compaction reshapes, ``summarizer`` makes every LLM
call, ``embedding`` the plan's vectors. Nothing here writes: the processor
applies the plan.
"""
