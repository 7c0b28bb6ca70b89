"""The plugin host: hook and drafter specs, the registry, plugins found and isolated."""
