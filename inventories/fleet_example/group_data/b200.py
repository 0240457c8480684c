"""B200 (SM100, NVLink): trtllm_mla + fa4 draft, as the drafter's model card uses."""

specfleet = {
    "plan": {"mem_fraction_static": 0.9},
}
