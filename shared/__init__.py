"""Code both the gateway and the workers import: settings, schemas, keys, engines, DB models."""
