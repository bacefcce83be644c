"""Model implementations and the architecture registry."""
