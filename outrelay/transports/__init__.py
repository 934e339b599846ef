"""First-party transports, each registered through the ``outrelay`` entry-point group."""
