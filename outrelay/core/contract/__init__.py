"""The transport contract: what a transport implements to publish (``Transport``,
progress of a send, targets rendered from templates and segments) and to read back
and subscribe (``Reader``, ``SubscriptionBackend``).

May import from outrelay.core: model.
"""
