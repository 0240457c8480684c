"""Settings every host of the example fleet shares: the file stem of fleet_example.py is a group."""

ssh_user = "root"

specfleet = {
    "models_root": "/srv/models",
    "sglang": {"version": "0.5.23"},
    # Placeholder commits: pin the revisions your fleet has validated.
    "target": {"revision": "0123456789abcdef0123456789abcdef01234567"},
    "drafter": {"revision": "89abcdef0123456789abcdef0123456789abcdef"},
    # The rollout is one for the whole fleet, so its options live here, not per arch group.
    "rollout": {
        "canary": "b200-01",
        "batch_percent": 25.0,
        "max_fail_percent": 25.0,
        "prefetch_weights": True,
    },
}
