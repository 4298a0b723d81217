"""Models: presets, the memory plan, the model manager (load, keep warm, evict) and what the
engine knows about its image source (`sources`)."""
