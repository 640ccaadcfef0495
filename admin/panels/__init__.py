"""The Admin tab's panels, one module each, composed by admin/ui.py: the dashboard (state and charts), the
settings form, API keys, cloned voices, the pronunciation lexicon and the audit log."""
