"""The outbox's history: reading a stream or a filtered scan, lean events for folds, replay
and snapshots, upcasters for old versions, redelivery of history, the audit chain.

May import from outrelay.core: model, config, stores.
"""
