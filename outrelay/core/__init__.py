"""outrelay's core, in layered sub-packages: ``model``, ``contract``, ``config``, ``stores``,
``history``, ``relay``, ``consumer``. Each sub-package's docstring says which of the others it
may import; docs/design.md draws the map. Users import from ``outrelay`` (and transport authors
from ``outrelay.kit``), not from here.
"""
