"""What the surfaces (api/, ui/, admin/) share, below them: access control (who is calling, API keys, the tiers'
rate limits on one counter store: control.py). Accounting is the service's (SpeechService.tally: every answered
request counted and logged alike). Imports tts_core and storage only; no surface imports another
(docs/architecture.md)."""
