"""The sweep tiers (`*.toml`), shipped as package data: `harness.cases` finds them through
`importlib.resources`, so an installed distribution runs `python -m harness run --tier smoke` from any
directory. Schema: cases/README.md."""
