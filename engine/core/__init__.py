"""The run lifecycle: the Engine (images, evaluators and runs served from the store, `recorded`
runs) and scale-out of a run's image generation across processes (`distributed`)."""
