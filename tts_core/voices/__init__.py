"""Which voices and models are offered (the catalogue and the YAML registry), and cloned voices."""
