"""Pieces the built-in envs share: model-output parsers (``parsing``) and the bounded, cached sandbox runner
(``sandbox_runner``). Not an env: nothing here registers itself."""
