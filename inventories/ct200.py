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
                # A move to another release goes beside the existing venv (kept for rollback)
                # instead of upgrading it in place, where pip could replace its torch.
                "sglang": {"version": "0.5.11", "side_by_side": True},
                "models_root": "/root/models",
                # No commit of moonshotai/Kimi-K2.6 could be pinned from here, so CT200 follows
                # main on purpose: the first run records the commit, and a later move of main
                # shows as a planned change instead of a silent 595 GB download. Pin a 40-hex
                # commit here (and set follow_branch False) once it is known.
                "target": {"revision": "main", "follow_branch": True},
                "drafter": {"revision": "main", "follow_branch": True},
                # SM120 field notes: more than 0.85 has been seen to OOM (the planner's default).
                "plan": {"sm120_target_backend": "triton"},
                # Opt in to PR#20547's DFlash v2 (overlap) worker on the existing 0.5.11 venv:
                # this project's port onto 0.5.11 (specfleet/patchdata/pr20547/sglang-0.5.11/),
                # made from the PR revision this sha256 pins. The deploy fetches the upstream
                # text the port's recipe names (the PR head's files at modal-labs/sglang
                # e67a0d488 from GitHub, the sglang 0.5.11 and 0.5.14 wheels from PyPI), checks
                # each against its sha256, and keeps v1 on an error. A control machine without
                # the internet: add "source": "/path/to/a/folder" holding those files. Verified
                # here, without a GPU: it applies with no fuzz to the 0.5.11 wheel's own files,
                # the verify-mask, penalty and overlap-switch logic run from the patched files,
                # removal gives the wheel back (RECORD). Only a GPU run shows that it serves: the
                # readiness gate, and a failed gate rolls the port back. Delete "patch" to stay v1.
                "patch": {
                    "sha256": "1c844c0fdcab59266c0b1bb46e2099b86469364ffd5ad5ac436f1a7f2847d252",
                },
            },
        },
    )
]
