"""Operator control: the admin REST API, the Admin tab, and live settings backed by storage."""
