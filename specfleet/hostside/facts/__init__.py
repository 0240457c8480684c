"""The Python scripts facts run on a host (``python -c``), as real files.

Each runs with ``-I`` on the host's own Python (3.8 and later); ``facts.hostpy.script_source``
puts the helpers it names (``# needs: ...``) from ``specfleet.hostside.dists`` or the weights agent
above it, so one ``-c`` argument carries it whole. None imports ``json`` or ``importlib.metadata``
unless it must: they run on every host of every deploy.
"""
