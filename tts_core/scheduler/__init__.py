"""Who runs next on each engine, and how: the queue, the engine loop with its strategies (one-shot batches, stepped
continuous batching) and their policies, device memory, the loaded models (pool) and dispatch (a text's pieces
queued, their audio back)."""
