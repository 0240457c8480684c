"""CT200: the real target, as its owner describes it. Nothing here ever connects to it.

8x RTX PRO 6000 Blackwell (SM120, 96 GB each), PCIe only (no NVLink). An existing venv at
/root/venv_sglang211 (Python 3.12, SGLang 0.5.11) is reused, not replaced. Models live under
/root/models on `/` (~593 GiB free); /dev/shm is 200 GiB. The host already has an HF token at
huggingface_hub's default path (~/.cache/huggingface/token), which is used in place.

Run: pyinfra inventories/ct200.py deploys/kimi_k26.py
"""

ct200 = [
    (
        "ct200",
        {
            "ssh_hostname": "10.1.2.200",
            "ssh_user": "root",
            "specfleet": {
                "venv": "/root/venv_sglang211",
                "sglang": {"version": "0.5.11"},
                "models_root": "/root/models",
                # No commit of moonshotai/Kimi-K2.6 could be pinned from here, so CT200 follows
                # main on purpose: the first run records the commit, and a later move of main
                # shows as a planned change instead of a silent 595 GB download. Pin a 40-hex
                # commit here (and set follow_branch False) once it is known.
                "target": {"revision": "main", "follow_branch": True},
                "drafter": {"revision": "main", "follow_branch": True},
                # SM120 field notes: more than 0.85 has been seen to OOM (the planner's default).
                "plan": {"sm120_target_backend": "triton"},
            },
        },
    )
]
