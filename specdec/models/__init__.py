"""Model and drafter folders: files checked, checkpoints, the cache, bundled models."""
