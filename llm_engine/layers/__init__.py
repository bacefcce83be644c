"""Model building blocks: parallel-aware linear layers, embeddings, rotary, norms, attention."""
