"""The model repository on disk, loading versions from it, and the live registry of loaded models."""
