"""RTX PRO 6000 Blackwell (SM120, PCIe only): triton MLA, flashinfer draft, <= 0.85 memory."""

specfleet = {
    "plan": {"sm120_target_backend": "triton", "mem_fraction_static": 0.85},
}
