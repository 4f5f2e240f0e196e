"""Configuration: the typed schema, loading through Hydra, and resolution of specialization levels."""
