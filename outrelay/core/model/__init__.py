"""The event model: the envelope, its ids, errors, CloudEvents mapping, trace context and
the history filter; values with no behaviour beyond checking and converting themselves.

May import from outrelay.core: nothing of outrelay.core.
"""
