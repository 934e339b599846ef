"""The configuration file and the plugins that extend it: the TOML document, validated and
frozen, with its ports checked and pydantic's errors made into one-line messages; the
pluggy hook specifications and the one registry per process, which finds transports,
stores, upcasters and the config sections plugins own.

May import from outrelay.core: model, contract.
"""
