"""tests/fleet/test_fanout_fleet.py: start (or stop) the fan-out's ephemeral sshd with the real ops,
from a spec file named in FANOUT_SERVE_SPEC (keys made by the test; ``models``: the revision
folders it serves, ``{dir_name: revision}``)."""

import json
import os

from pyinfra import host

from operations import fanout, weights
from specfleet.core.settings import settings_for_host

settings = settings_for_host(host)
spec = json.loads(open(os.environ["FANOUT_SERVE_SPEC"]).read())
present = os.environ.get("FANOUT_SERVE_PRESENT") == "1"
if present:
    weights.tools_from_settings(settings)
    fanout.agent(name="Fan-out agent")
fanout.serve(
    name="Fan-out sshd",
    present=present,
    rollout_id=spec["rollout_id"],
    port=spec["port"],
    public_key=spec["public_key"] if present else None,
    host_private_key=spec["host_private_key"] if present else None,
    receivers=spec["receivers"],
    models=spec.get("models"),
)
