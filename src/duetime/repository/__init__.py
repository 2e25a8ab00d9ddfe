"""The model repository on disk, loading versions from it, and the registry of loaded models."""
