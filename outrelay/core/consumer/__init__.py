"""The consuming side: the event bus, one subscription's runtime, the idempotency inbox and
consumer-side dead letters.

May import from outrelay.core: model, contract, config, stores, history, relay.
"""
