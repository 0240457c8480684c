"""Your first real host: the least an inventory needs. Copy this file, then replace each <...>.

    specfleet settings inventories/first_host.py        # the merged settings, checked
    pyinfra inventories/first_host.py deploys/kimi_k26.py --dry   # what would change, the plan
    pyinfra inventories/first_host.py deploys/kimi_k26.py         # do it; run again: no change

Every other setting has a default (docs/settings.md). Until the <...> are filled in, each is
named as a placeholder, with its key, before anything connects anywhere (by `specfleet`, and by
`pyinfra` run from the checkout: its config.py checks every host's settings before connecting).
"""

first_host = [
    (
        "gpu-box-1",  # the name pyinfra shows and `--limit` takes
        {
            "ssh_hostname": "<address of the GPU host>",
            "ssh_user": "root",  # or a user with sudo: then pass --sudo
            "specfleet": {
                # The SGLang release to install (a venv at /opt/specfleet/sglang unless "venv"
                # names one); the version table lists the releases the planner knows.
                "sglang": {"version": "0.5.11"},
                # Where the ~595 GB of weights go: a disk with room (preflight checks it).
                "models_root": "/srv/models",
                # Pin the commits you validated: `git ls-remote https://huggingface.co/REPO main`.
                "target": {"revision": "<40-hex commit of moonshotai/Kimi-K2.6>"},
                "drafter": {"revision": "<40-hex commit of z-lab/Kimi-K2.6-DFlash>"},
            },
        },
    )
]
