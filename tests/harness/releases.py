"""The SGLang releases the tests run against: the one list (each also has its row in
``specfleet/core/tables/sglang_versions.py``, the product's own table).

``WHEELHOUSE`` is every release whose wheel the test wheelhouse downloads
(``tests/harness/wheelhouse.py``) and whose rules the harness runs (``sglang_rules.py``);
``EACH_KIND`` is one release of each kind the plan tells apart: 0.5.11 (the DFlash v1 worker, the
port's base), 0.5.14 (the v2 worker built in) and 0.5.23 (server args as ``arg_groups``).
"""

from __future__ import annotations

WHEELHOUSE = ("0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.19",
              "0.5.20", "0.5.21", "0.5.22", "0.5.23")
EACH_KIND = ("0.5.11", "0.5.14", "0.5.23")
