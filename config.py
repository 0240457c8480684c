"""pyinfra's config file for runs from this checkout: pyinfra's CLI execs ``./config.py`` before it
loads the inventory (``--config FILE`` names another; add the two lines below to yours).

It registers specfleet's settings check, run just before pyinfra connects to each host: a typo in
a key, a bad value or a ``<...>`` placeholder left in the inventory is reported for that host
without connecting to it (``operations/connect_check.py``).
"""

from pyinfra import state

from operations.connect_check import register

register(state)
