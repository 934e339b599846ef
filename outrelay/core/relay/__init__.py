"""The relay: its loops, one delivery loop per destination, routing and the hand-off of new
appends, the memory budget, retries, the circuit breaker, the attempt log and unrouted
events.

May import from outrelay.core: model, contract, config, stores, history.
"""
